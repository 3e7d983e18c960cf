// Fine-tuning a published model against transformers: the first 3 AdamW steps of the committed
// tiny Llama on one fixed batch (tests/data/finetune_golden.json, written by
// tests/data/make_finetune_goldens.py with LlamaForCausalLM and torch.optim.AdamW).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/tape.h"
#include "nn/pretrained.h"
#include "optim/adamw.h"
#include "optim/clip.h"

using namespace tapegrad;
namespace fs = std::filesystem;
using json = nlohmann::json;

TEST_CASE("the first 3 AdamW steps of the tiny Llama give transformers' losses and gradient norms within 1e-4") {
  const fs::path data = fs::path(TAPEGRAD_SOURCE_DIR) / "tests" / "data";
  std::ifstream in(data / "finetune_golden.json");
  REQUIRE_MESSAGE(in, "cannot read tests/data/finetune_golden.json");
  const json golden = json::parse(in);
  nn::PretrainedModel pretrained = nn::load_pretrained((fs::path(TAPEGRAD_SOURCE_DIR) / golden["model"]).string());
  nn::LanguageModel& model = pretrained.model;
  model.set_training(true);

  const std::size_t batch = golden["batch"], seq = golden["seq"];
  std::vector<std::int32_t> inputs, targets;  // (B, T) each: windows of T + 1 ids
  for (const json& window : golden["windows"]) {
    REQUIRE(window.size() == seq + 1);
    for (std::size_t t = 0; t < seq; ++t) inputs.push_back(window[t]), targets.push_back(window[t + 1]);
  }
  REQUIRE(inputs.size() == batch * seq);

  ParameterList params = model.params();
  // torch's parameter groups: weight decay on the matrices only, as AdamW's decay_all_params false.
  std::size_t matrices = 0, others = 0;
  for (const NamedParameter& p : params)
    (p.var.value().shape().size() >= 2 ? matrices : others) += p.var.value().size();
  CHECK(matrices == golden["decayed_parameters"].get<std::size_t>());
  CHECK(others == golden["kept_parameters"].get<std::size_t>());
  optim::AdamW optimizer(params, {.lr = golden["lr"].get<float>(),
                                  .beta1 = golden["beta1"].get<float>(),
                                  .beta2 = golden["beta2"].get<float>(),
                                  .eps = golden["eps"].get<float>(),
                                  .weight_decay = golden["weight_decay"].get<float>()});

  auto relative = [](double ours, double theirs) { return std::abs(ours - theirs) / std::abs(theirs); };
  const json& losses = golden["losses"];
  const json& norms = golden["grad_norms"];
  for (std::size_t step = 0; step < norms.size(); ++step) {
    CAPTURE(step);
    Tape tape;
    Var loss = model.loss(inputs, targets, batch, seq);
    tape.backward(loss);
    const double norm = optim::clip_grad_norm(params, std::numeric_limits<float>::max());  // the norm alone
    CHECK(relative(loss.value().item(), losses[step].get<double>()) < 1e-4);
    CHECK(relative(norm, norms[step].get<double>()) < 1e-4);
    optimizer.step();
    optimizer.zero_grad();
  }
  NoGradScope no_grad;
  const double after = model.loss(inputs, targets, batch, seq).value().item();
  CHECK(relative(after, losses.back().get<double>()) < 1e-4);  // the third update
}
