// LoRA adapters: which Linear each target names, adding them (PEFT's initialisation), merging,
// checkpoint metadata, and PEFT's two files, read and written.
#include "nn/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "core/kernels.h"
#include "core/random.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "nn/linear.h"
#include "nn/models/foreign_tensors.h"
#include "nn/models/llama.h"

namespace tapegrad::nn {

namespace {

using json = nlohmann::json;

/// A target's names: the flag's, the block member's (Llama's and the rotary decoder's scheme) and PEFT's.
struct Target {
  std::string_view name, member, peft;
};
constexpr Target kTargets[] = {{"q", "attn.wq", "q_proj"},      {"k", "attn.wk", "k_proj"},
                               {"v", "attn.wv", "v_proj"},      {"o", "attn.wo", "o_proj"},
                               {"gate", "ffn.w1", "gate_proj"}, {"up", "ffn.w3", "up_proj"},
                               {"down", "ffn.w2", "down_proj"}};

const Target* find_target(std::string_view name) {
  for (const Target& t : kTargets)
    if (t.name == name) return &t;
  return nullptr;
}

/// A projection of a block: its path ("blocks.3.attn.wq"), its layer and the target it is.
struct Projection {
  std::string path;
  Linear* layer;
  const Target* target;
};

// Every Linear under the model, with its dotted path, in members() order.
class LinearCollector final : public Members {
 public:
  using Members::operator();
  void operator()(std::string_view, Var&) override {}
  void operator()(std::string_view name, Module& child) override {
    const std::size_t length = prefix_.size();
    prefix_.append(name);
    if (auto* linear = dynamic_cast<Linear*>(&child)) found.push_back({prefix_, linear});
    prefix_.append(".");
    child.members(*this);
    prefix_.resize(length);
  }
  std::vector<std::pair<std::string, Linear*>> found;

 private:
  std::string prefix_;
};

/// The projections of the model's blocks that LoRA can target ("blocks.N.<member>").
std::vector<Projection> projections(const LanguageModel& model) {
  LinearCollector collector;
  // members() is the one walk for reading and for writing (as Module::params() uses it).
  const_cast<LanguageModel&>(model).module().members(collector);
  std::vector<Projection> out;
  for (auto& [path, layer] : collector.found) {
    if (path.rfind("blocks.", 0) != 0) continue;
    for (const Target& t : kTargets)
      if (path.size() > t.member.size() && path.ends_with(t.member) && path[path.size() - t.member.size() - 1] == '.')
        out.push_back({path, layer, &t});
  }
  return out;
}

void check_options(const LoraOptions& o) {
  if (o.rank == 0) throw std::invalid_argument("LoRA: the rank must be at least 1");
  if (!(std::isfinite(o.alpha) && o.alpha > 0))
    throw std::invalid_argument(fmt::format("LoRA: alpha must be a positive number, got {}", o.alpha));
  std::set<std::string> seen;
  for (const std::string& name : o.targets) {
    if (!find_target(name))
      throw std::invalid_argument(fmt::format("LoRA: unknown target '{}'; the targets are {}", name,
                                              fmt::join(lora_target_names(), ",")));
    if (!seen.insert(name).second) throw std::invalid_argument(fmt::format("LoRA: target '{}' is given twice", name));
  }
  if (o.targets.empty()) throw std::invalid_argument("LoRA: no targets");
}

// Adapters of zero on the targeted projections, the model frozen first; returns the projections adapted.
std::vector<Projection> add_zero_adapters(LanguageModel& model, const LoraOptions& o) {
  check_options(o);
  std::vector<Projection> chosen;
  for (Projection& p : projections(model)) {
    if (p.layer->adapter)
      throw std::invalid_argument(fmt::format("LoRA: {} has an adapter already (merge_lora it first)", p.path));
    if (std::find(o.targets.begin(), o.targets.end(), p.target->name) == o.targets.end()) continue;
    if (o.rank > std::min(p.layer->in(), p.layer->out()))
      throw std::invalid_argument(fmt::format("LoRA: rank {} exceeds the smaller side of {} ({} x {})", o.rank, p.path,
                                              p.layer->in(), p.layer->out()));
    chosen.push_back(p);
  }
  if (chosen.empty())
    throw std::invalid_argument(fmt::format("LoRA: the model ({}) has no projection named {}", model.arch(),
                                            fmt::join(o.targets, ", ")));
  model.module().freeze();
  for (Projection& p : chosen)
    p.layer->adapter = LoraAdapter{Var(Tensor({p.layer->in(), o.rank}), true), Var(Tensor({o.rank, p.layer->out()}), true),
                                   o.alpha};
  return chosen;
}

/// The Hugging Face layout of the model's parameters: Llama's (other architectures have no PEFT names here).
std::vector<ForeignTensor> hf_layout(const LanguageModel& model, const std::string& what) {
  if (const Llama* llama = model.as<Llama>()) return llama_foreign_tensors(llama->config());
  throw std::invalid_argument(fmt::format("{}: PEFT's files name Hugging Face modules, and a {} model has no "
                                          "Hugging Face layout here (a llama has)",
                                          what, model.arch()));
}

/// PEFT's key prefix of a projection ("base_model.model.model.layers.3.self_attn.q_proj") and
/// the heads of its rotate-half rows (0: none).
std::pair<std::string, std::size_t> peft_module(const std::vector<ForeignTensor>& layout, const Projection& p) {
  for (const ForeignTensor& t : layout)
    if (t.param == p.path + ".weight") {
      constexpr std::string_view weight = ".weight";
      return {"base_model.model." + t.hf_name.substr(0, t.hf_name.size() - weight.size()), t.hf_rope_heads};
    }
  throw std::logic_error(fmt::format("LoRA: the Hugging Face layout names no tensor for {}", p.path));
}

}  // namespace

bool has_peft_layout(const LanguageModel& model) { return model.as<Llama>() != nullptr; }

std::vector<std::string_view> lora_target_names() {
  std::vector<std::string_view> out;
  for (const Target& t : kTargets) out.push_back(t.name);
  return out;
}

void add_lora(LanguageModel& model, const LoraOptions& options) {
  std::vector<Projection> chosen = add_zero_adapters(model, options);
  Rng rng(options.seed);
  for (Projection& p : chosen) {
    // kaiming_uniform_(a = sqrt(5)) on PEFT's (r, in) matrix: gain sqrt(2 / (1 + 5)), bound
    // gain * sqrt(3 / in) = 1 / sqrt(in).
    const float bound = 1.0f / std::sqrt(float(p.layer->in()));
    Tensor& a = p.layer->adapter->a.mutable_value();
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = bound * (2.0f * rng.uniform() - 1.0f);
  }
}

std::optional<LoraOptions> lora_of(const LanguageModel& model) {
  std::optional<LoraOptions> out;
  for (const Projection& p : projections(model)) {
    if (!p.layer->adapter) continue;
    if (!out) out = LoraOptions{p.layer->adapter->a.shape()[1], p.layer->adapter->alpha, {}, 0};
    const std::string name(p.target->name);
    if (std::find(out->targets.begin(), out->targets.end(), name) == out->targets.end()) out->targets.push_back(name);
  }
  return out;
}

std::size_t merge_lora(LanguageModel& model) {
  std::size_t merged = 0;
  for (Projection& p : projections(model)) {
    if (!p.layer->adapter) continue;
    const LoraAdapter& adapter = *p.layer->adapter;
    const std::size_t in = p.layer->in(), out = p.layer->out(), rank = adapter.a.shape()[1];
    // W (in, out) += scale A (in, r) B (r, out)
    kernels::gemm<float>(false, false, in, out, rank, adapter.scale(), adapter.a.value().data(), rank,
                         adapter.b.value().data(), out, 1.0f, p.layer->weight.mutable_value().data(), out);
    p.layer->adapter.reset();
    ++merged;
  }
  return merged;
}

Metadata lora_metadata(const LanguageModel& model) {
  const std::optional<LoraOptions> o = lora_of(model);
  if (!o) return {};
  return {{"lora.rank", std::to_string(o->rank)},
          {"lora.alpha", fmt::format("{}", o->alpha)},
          {"lora.targets", fmt::format("{}", fmt::join(o->targets, ","))}};
}

void add_lora_from_metadata(LanguageModel& model, const Metadata& metadata) {
  if (!metadata.count("lora.rank")) return;
  LoraOptions o;
  o.rank = metadata_size(metadata, "lora.rank");
  o.alpha = float(metadata_positive(metadata, "lora.alpha"));
  o.targets.clear();
  const std::string& targets = metadata_text(metadata, "lora.targets");
  for (std::size_t begin = 0; begin <= targets.size();) {
    const std::size_t end = std::min(targets.find(',', begin), targets.size());
    o.targets.push_back(targets.substr(begin, end - begin));
    begin = end + 1;
  }
  try {
    add_zero_adapters(model, o);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("metadata lora.rank {}, lora.alpha {}, lora.targets '{}': {}", o.rank, o.alpha,
                                         targets, e.what()));
  }
}

void save_peft_adapter(const std::string& folder, const LanguageModel& model, const std::string& base_model) {
  const std::optional<LoraOptions> o = lora_of(model);
  if (!o) throw std::invalid_argument(fmt::format("save_peft_adapter {}: the model has no LoRA adapters", folder));
  const std::vector<ForeignTensor> layout = hf_layout(model, "save_peft_adapter " + folder);
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
  for (const Projection& p : projections(model)) {
    if (!p.layer->adapter) continue;
    const auto [module, rope_heads] = peft_module(layout, p);
    Tensor lora_b = transposed(p.layer->adapter->b.value());  // (out, r)
    if (rope_heads > 0) lora_b = unpermute_rope_rows(lora_b, rope_heads);
    names.push_back(module + ".lora_A.weight");
    tensors.push_back(transposed(p.layer->adapter->a.value()));  // (r, in)
    names.push_back(module + ".lora_B.weight");
    tensors.push_back(std::move(lora_b));
  }
  std::vector<std::pair<std::string, const Tensor*>> entries;
  for (std::size_t i = 0; i < names.size(); ++i) entries.emplace_back(names[i], &tensors[i]);
  std::vector<std::string> modules;
  for (const std::string& name : o->targets) modules.push_back(std::string(find_target(name)->peft));
  const json config = {{"peft_type", "LORA"},
                       {"task_type", "CAUSAL_LM"},
                       {"base_model_name_or_path", base_model},
                       {"r", o->rank},
                       {"lora_alpha", o->alpha},
                       {"target_modules", modules},
                       {"lora_dropout", 0.0},
                       {"bias", "none"},
                       {"fan_in_fan_out", false},
                       {"use_rslora", false},
                       {"use_dora", false},
                       {"modules_to_save", nullptr},
                       {"rank_pattern", json::object()},
                       {"alpha_pattern", json::object()},
                       {"init_lora_weights", true},
                       {"inference_mode", true}};
  std::filesystem::create_directories(folder);
  write_safetensors(folder + "/adapter_model.safetensors", entries, {{"format", "pt"}});
  const std::string config_text = config.dump(2) + "\n";
  io::AtomicFile config_file(folder + "/adapter_config.json");
  config_file.write(config_text.data(), config_text.size());
  config_file.commit();
}

LoraOptions load_peft_adapter(const std::string& folder, LanguageModel& model) {
  const std::string config_path = folder + "/adapter_config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open the file (a PEFT adapter folder has it)", config_path));
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not JSON: {}", config_path, e.what()));
  }
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw std::runtime_error(fmt::format("{}: '{}' {}", config_path, key, why));
  };
  if (!config.is_object()) refuse("(top level)", "is not an object");
  auto field = [&](const std::string& key) -> const json* {
    auto it = config.find(key);
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  auto require_value = [&](const std::string& key, const json& expected, const std::string& why) {
    const json* value = field(key);
    if (value && *value != expected) refuse(key, fmt::format("is {}; {}", value->dump(), why));
  };
  const json* peft_type = field("peft_type");
  if (!peft_type || *peft_type != "LORA")
    refuse("peft_type", fmt::format("is {}; only LORA adapters are read", peft_type ? peft_type->dump() : "missing"));
  require_value("use_dora", false, "DoRA is not applied by tapegrad");
  require_value("use_rslora", false, "rsLoRA's alpha / sqrt(r) scale is not applied by tapegrad");
  require_value("fan_in_fan_out", false, "only (out, in) weights are read");
  require_value("bias", "none", "adapter biases are not applied by tapegrad");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (const json* value = field(key); value && !value->empty()) refuse(key, "is not empty; per-layer ranks and alphas are not applied");
  for (const char* key : {"modules_to_save", "layers_to_transform"})
    if (field(key)) refuse(key, "is set; tapegrad applies adapters to every block's projections only");
  LoraOptions o;
  const json* r = field("r");
  if (!r || !r->is_number_integer() || r->get<std::int64_t>() < 1) refuse("r", "must be a positive integer");
  o.rank = r->get<std::size_t>();
  const json* alpha = field("lora_alpha");
  if (!alpha || !alpha->is_number() || !(alpha->get<double>() > 0)) refuse("lora_alpha", "must be a positive number");
  o.alpha = alpha->get<float>();
  const json* modules = field("target_modules");
  if (!modules || !modules->is_array())
    refuse("target_modules", "must be a list of module names (a pattern is not read)");
  o.targets.clear();
  for (const json& module : *modules) {
    const Target* found = nullptr;
    for (const Target& t : kTargets)
      if (module.is_string() && module.get<std::string>() == t.peft) found = &t;
    if (!found)
      refuse("target_modules", fmt::format("names {}; the modules tapegrad adapts are q_proj, k_proj, v_proj, o_proj, "
                                           "gate_proj, up_proj, down_proj",
                                           module.dump()));
    o.targets.emplace_back(found->name);
  }
  const std::string weights_path = folder + "/adapter_model.safetensors";
  SafetensorsFile file = read_safetensors(weights_path);
  const std::vector<ForeignTensor> layout = hf_layout(model, "load_peft_adapter " + folder);
  // Every tensor is read and checked before the model changes: a refused file leaves it as it was.
  std::vector<std::pair<Tensor, Tensor>> values;  // A (in, r), B (r, out) of each projection adapted
  for (const Projection& p : projections(model)) {
    if (std::find(o.targets.begin(), o.targets.end(), p.target->name) == o.targets.end()) continue;
    const auto [module, rope_heads] = peft_module(layout, p);
    auto take = [&](const std::string& name, const Shape& shape) {
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) throw std::runtime_error(fmt::format("{}: tensor '{}' is missing", weights_path, name));
      Tensor t = std::move(it->second);
      file.tensors.erase(it);
      if (t.shape() != shape)
        throw std::runtime_error(fmt::format("{}: tensor '{}' has shape {}; r {} and the base model make it {}",
                                             weights_path, name, to_string(t.shape()), o.rank, to_string(shape)));
      for (std::size_t i = 0; i < t.size(); ++i)
        if (!std::isfinite(t[i]))
          throw std::runtime_error(fmt::format("{}: tensor '{}' holds {} at element {}", weights_path, name, t[i], i));
      return t;
    };
    Tensor lora_a = take(module + ".lora_A.weight", {o.rank, p.layer->in()});
    Tensor lora_b = take(module + ".lora_B.weight", {p.layer->out(), o.rank});
    if (rope_heads > 0) lora_b = permute_rope_rows(lora_b, rope_heads);
    values.emplace_back(transposed(lora_a), transposed(lora_b));
  }
  if (!file.tensors.empty())
    throw std::runtime_error(fmt::format("{}: tensor '{}' is not an adapter of the targets {} of this model",
                                         weights_path, file.tensors.begin()->first, modules->dump()));
  std::vector<Projection> adapted;
  try {
    adapted = add_zero_adapters(model, o);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", config_path, e.what()));
  }
  for (std::size_t i = 0; i < adapted.size(); ++i) {
    adapted[i].layer->adapter->a.mutable_value() = std::move(values[i].first);
    adapted[i].layer->adapter->b.mutable_value() = std::move(values[i].second);
  }
  return o;
}

}  // namespace tapegrad::nn
