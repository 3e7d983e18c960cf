// The Llama architecture: parameter names and shapes, refused configurations, gradients on grouped
// and shared KV heads.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "core/ops.h"
#include "io/gguf.h"
#include "io/hf_folder.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "optim/adamw.h"
#include "support/checks.h"
#include "support/small_llama.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;
using test::values;

namespace {

std::vector<Tensor> gradients(const Llama& model, std::span<const std::int32_t> ids,
                              std::span<const std::int32_t> targets, std::size_t batch, std::size_t seq) {
  {
    Tape tape;
    tape.backward(model.loss(ids, targets, batch, seq));
  }
  std::vector<Tensor> grads;
  for (auto& p : model.params()) {
    grads.push_back(p.var.grad());
    p.var.zero_grad();
  }
  return grads;
}

}  // namespace

TEST_CASE("llama has the shared parameter names, (D, H*Dh) q and (D, KVH*Dh) k and v, and counts tied and untied") {
  LlamaConfig c = test::small_llama_config();
  c.head_dim = 6;  // not d_model / n_heads: q (16, 24), k and v (16, 12), o (24, 16)
  Llama model(c);
  std::vector<std::string> names;
  std::map<std::string, Shape> shapes;
  for (const auto& p : model.params()) names.push_back(p.name), shapes[p.name] = p.var.shape();
  std::vector<std::string> expected = {"embed.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* n : {"attn_norm.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight",
                          "ffn_norm.weight", "ffn.w1.weight", "ffn.w3.weight", "ffn.w2.weight"})
      expected.push_back(fmt::format("blocks.{}.{}", i, n));
  for (const char* n : {"norm.weight", "head.weight"}) expected.push_back(n);
  CHECK(names == expected);
  CHECK(shapes["blocks.0.attn.wq.weight"] == Shape{16, 24});
  CHECK(shapes["blocks.0.attn.wk.weight"] == Shape{16, 12});
  CHECK(shapes["blocks.0.attn.wv.weight"] == Shape{16, 12});
  CHECK(shapes["blocks.0.attn.wo.weight"] == Shape{24, 16});
  CHECK(shapes["head.weight"] == Shape{16, 11});
  // Per block: 2 norms (32) + q 384 + k, v 2 * 192 + o 384 + FFN 3 * 384 = 2336; embed 176, norm 16, head 176.
  CHECK(model.num_params() == 176 + 2 * 2336 + 16 + 176);
  c.tied_head = true;
  Llama tied(c);
  CHECK(tied.num_params() == model.num_params() - 176);
  CHECK(tied.params().back().name == "norm.weight");
  CHECK(fmt::format("{}", model) == "Llama(vocab=11, d_model=16, n_heads=4, n_kv_heads=2, head_dim=6, n_blocks=2, "
                                    "max_len=24, d_ff=24, tied_head=false)");
  CHECK(model.config().n_kv_heads == 2u);  // filled in
  const LlamaConfig default_kv{.vocab = 5, .d_model = 8, .n_heads = 2, .n_blocks = 1, .max_len = 4};
  CHECK(Llama(default_kv).config().kv_heads() == 2);
}

TEST_CASE("llama refuses impossible configurations naming the values") {
  auto error = [](LlamaConfig c) { return test::error_of([&] { Llama model(c); }); };
  LlamaConfig c = test::small_llama_config();
  c.n_kv_heads = 3;
  CHECK(error(c) == "llama(vocab=11, d_model=16, n_heads=4, n_kv_heads=3, head_dim=4, n_blocks=2, max_len=24, "
                    "d_ff=24): n_kv_heads 3 does not divide n_heads 4");
  c = test::small_llama_config(), c.head_dim = 5;
  CHECK(test::contains(error(c), "head_dim 5 must be even for RoPE"));
  c = test::small_llama_config(), c.d_model = 18;
  CHECK(test::contains(error(c), "d_model 18 is not divisible by n_heads 4 (give head_dim)"));
  c = test::small_llama_config(), c.n_kv_heads = 0;
  CHECK(test::contains(error(c), "every size must be positive"));
  c = test::small_llama_config(), c.max_len = std::size_t(1) << 21;
  CHECK(test::contains(error(c), "max_len 2097152 exceeds the supported 1048576"));
  c = test::small_llama_config(), c.dropout = 1;
  CHECK(test::contains(error(c), "dropout 1 must be in [0, 1)"));
  c = test::small_llama_config(), c.rope_theta = 0;
  CHECK(test::contains(error(c), "rope_theta 0 must be positive"));
}

TEST_CASE("llama's gradient passes gradcheck, tied and untied, on grouped and shared KV heads") {
  for (auto [tied, kv_heads] : {std::pair{false, std::size_t(2)}, std::pair{true, std::size_t(1)}}) {
    CAPTURE(tied);
    CAPTURE(kv_heads);
    Llama model(test::gradcheck_llama_config(kv_heads, tied));
    // Larger than the default init, so that every path carries signal above the float noise; the
    // tied embedding at 0.3, as it enters twice (its loss is more curved: at 0.5 the central
    // differences' truncation error at eps 1e-2 reached the tolerance).
    Rng rng(3);
    for (auto& p : model.params())
      if (p.var.shape().size() == 2)
        rng.fill_normal(p.var.mutable_value(), tied && p.name == "embed.weight" ? 0.3f : 0.5f);
    auto ids = random_ids(2 * 5, 7, 4), targets = random_ids(2 * 5, 7, 5);
    {
      Tape tape;
      tape.backward(model.loss(ids, targets, 2, 5));
    }
    for (NamedParameter& p : model.params()) {
      Var& var = p.var;
      std::vector<float> x = values(var.value());
      std::vector<float> analytic(var.grad().data(), var.grad().data() + x.size());
      auto forward = [&] {
        std::copy(x.begin(), x.end(), var.node().value.data());
        NoGradScope no_grad;
        return std::vector<float>{model.loss(ids, targets, 2, 5).value().item()};
      };
      GradcheckReport r = check_kernel_gradient<float>(p.name, x, forward, {1.0f}, analytic, test::kFloatEps,
                                                       test::kFloatAtol, test::kFloatRtol);
      std::copy(x.begin(), x.end(), var.node().value.data());
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
}

TEST_CASE("llama trains: a few AdamW steps lower the loss of one batch") {
  Llama model(test::small_llama_config(true));
  auto ids = random_ids(2 * 16, 11, 1), targets = random_ids(2 * 16, 11, 2);
  ParameterList params = model.params();
  optim::AdamW optimizer(params, {.lr = 1e-2f});
  float first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    Tape tape;
    Var loss = model.loss(ids, targets, 2, 16);
    (step == 0 ? first : last) = loss.value().item();
    tape.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
  }
  CHECK(std::fabs(first - std::log(11.0f)) < 0.1f);
  CHECK(last < first - 0.3f);
}

TEST_CASE("llama with remat gives bit-identical gradients") {
  LlamaConfig c = test::small_llama_config();
  Llama plain(c);
  c.remat = true;
  Llama remat(c);
  auto ids = random_ids(3 * 20, 11, 1), targets = random_ids(3 * 20, 11, 2);
  const auto a = gradients(plain, ids, targets, 3, 20), b = gradients(remat, ids, targets, 3, 20);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(values(a[i]) == values(b[i]));
}

TEST_CASE("llama's forward, prefill and steps agree, and a cache shorter than max_len decodes the same") {
  Llama model(test::small_llama_config());
  Rng rng(5);
  for (auto& p : model.params())
    if (p.var.shape().size() == 2) rng.fill_normal(p.var.mutable_value(), 0.3f);
  auto ids = random_ids(12, 11, 7);
  Tensor full;
  {
    NoGradScope no_grad;
    full = model.forward(ids, 1, ids.size()).value();
  }
  auto close = [](std::span<const float> a, const float* b) {  // 1e-5 relative to max(1, |logit|), as test_kv_cache
    float worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
    return worst <= 1e-5f;
  };
  KVCache cache = model.make_cache();
  CHECK(cache.max_len() == 24);
  CHECK(cache.width() == 2 * 4);  // n_kv_heads * head_dim
  Tensor prefilled = model.prefill(std::span(ids).first(8), cache);
  CHECK(close({prefilled.data(), prefilled.size()}, full.data()));
  for (std::size_t t = 8; t < ids.size(); ++t) CHECK(close(model.step(ids[t], cache), full.data() + t * 11));
  KVCache short_cache = model.make_cache(1, 12);
  CHECK(short_cache.max_len() == 12);
  for (std::size_t t = 0; t < ids.size(); ++t) CHECK(close(model.step(ids[t], short_cache), full.data() + t * 11));
  CHECK(test::contains(test::error_of([&] { model.step(ids[0], short_cache); }), "run past max_len 12"));
  CHECK(test::error_of([&] { model.make_cache(1, 25); }) == "make_cache: max_len 25 exceeds the model's max_len 24");
}

TEST_CASE("llama is registered: checkpoints save and load through its name with every config field") {
  LlamaConfig c = test::small_llama_config(true, 1);
  c.head_dim = 6, c.norm_eps = 1e-6f, c.rope_theta = 50000.0;
  LanguageModel model(Llama{c});
  const tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("abcdefghijk");
  const std::string path = test::process_path("llama.safetensors");
  save_model_checkpoint(path, model, tokenizer);
  LoadedModelCheckpoint loaded = load_model_checkpoint(path);
  const Llama* back = loaded.model.as<Llama>();
  REQUIRE(back != nullptr);
  CHECK(loaded.model.arch() == "llama");
  CHECK(llama_config_metadata(back->config()) == llama_config_metadata(model.as<Llama>()->config()));
  CHECK(back->config().tied_head);
  CHECK(back->config().kv_heads() == 1);
  CHECK(back->config().head_size() == 6);
  const ParameterList a = model.params(), b = loaded.model.params();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(values(a[i].var.value()) == values(b[i].var.value()));
  Metadata bad = llama_config_metadata(c);
  bad["tied_head"] = "yes";
  CHECK(test::error_of([&] { llama_config_from_metadata(bad); }) ==
        "checkpoint metadata: tied_head must be true or false, got 'yes'");
  CHECK(find_architecture("llama").name == "llama");
}

// ---- foreign tensors --------------------------------------------------------------------------

TEST_CASE("Hugging Face q rows permuted, then interleaved RoPE, equal rotate-half RoPE on the rows as stored") {
  // Rotate-half (Hugging Face's apply_rotary_pos_emb), in double: for i < Dh/2, with angle
  // a = m theta^(-2i/Dh), out[i] = x[i] cos a - x[i + Dh/2] sin a, out[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a.
  const std::size_t H = 3, Dh = 8, D = 5, half = Dh / 2;
  const double theta = 10000.0;
  const Tensor w = test::random_tensor({H * Dh, D}, 1), k_w = test::random_tensor({H * Dh, D}, 3);
  const Tensor x = test::random_tensor({D}, 2);
  auto project = [&](const Tensor& m) {
    std::vector<double> y(H * Dh);
    for (std::size_t r = 0; r < H * Dh; ++r)
      for (std::size_t c = 0; c < D; ++c) y[r] += double(m.data()[r * D + c]) * double(x.data()[c]);
    return y;
  };
  auto rotate_half = [&](std::vector<double> y, std::size_t m) {
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < half; ++i) {
        const double a = double(m) * std::pow(theta, -2.0 * double(i) / double(Dh));
        const double lo = y[h * Dh + i], hi = y[h * Dh + i + half];
        y[h * Dh + i] = lo * std::cos(a) - hi * std::sin(a);
        y[h * Dh + i + half] = hi * std::cos(a) + lo * std::sin(a);
      }
    return y;
  };
  const auto table = kernels::make_rope_table<double>(16, Dh, theta);
  for (std::size_t m : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(15)}) {
    CAPTURE(m);
    const std::vector<double> want = rotate_half(project(w), m);
    std::vector<double> got = project(permute_rope_rows(w, H));
    kernels::rope_forward<double>(got.data(), got.data(), table, 1, 1, H, Dh, m);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < half; ++i) {  // interleaved pair (2i, 2i + 1) is rotate-half's (i, i + Dh/2)
        CHECK(got[h * Dh + 2 * i] == doctest::Approx(want[h * Dh + i]).epsilon(1e-12));
        CHECK(got[h * Dh + 2 * i + 1] == doctest::Approx(want[h * Dh + i + half]).epsilon(1e-12));
      }
    // So attention scores are unchanged: q . k with both permuted equals Hugging Face's.
    const std::vector<double> k_want = rotate_half(project(k_w), m);
    std::vector<double> k_got = project(permute_rope_rows(k_w, H));
    kernels::rope_forward<double>(k_got.data(), k_got.data(), table, 1, 1, H, Dh, m);
    double dot_want = 0, dot_got = 0;
    for (std::size_t j = 0; j < H * Dh; ++j) dot_want += want[j] * k_want[j], dot_got += got[j] * k_got[j];
    CHECK(dot_got == doctest::Approx(dot_want).epsilon(1e-12));
  }
  CHECK(test::contains(test::error_of([] { permute_rope_rows(Tensor({6, 2}), 4); }), "do not split into 4 heads"));
}

namespace {
// A Hugging Face (or GGUF) file made from a model: each parameter put in the file's layout, the
// inverse of what load_foreign_tensors does (fused parts concatenated, rotate-half rows, (out, in)).
std::map<std::string, Tensor> foreign_file(const Module& model, std::span<const ForeignTensor> map, bool hf) {
  std::map<std::string, Tensor> params, file;
  for (const auto& p : model.params()) params.emplace(p.name, p.var.value());
  for (const ForeignTensor& e : map) {
    Tensor t = params.at(e.param);
    const bool conv1d = hf && e.hf_conv1d;
    if (e.linear_weight && !conv1d) {  // (in, out) -> (out, in)
      Tensor tt = Tensor::uninitialized({t.dim(1), t.dim(0)});
      for (std::size_t r = 0; r < t.dim(0); ++r)
        for (std::size_t c = 0; c < t.dim(1); ++c) tt.data()[c * t.dim(0) + r] = t.data()[r * t.dim(1) + c];
      t = tt;
    }
    if (hf && e.hf_rope_heads > 0) {  // interleaved -> rotate-half: the inverse row permutation
      const std::size_t rows = t.dim(0), cols = t.dim(1), Dh = rows / e.hf_rope_heads;
      Tensor u = Tensor::uninitialized(t.shape());
      for (std::size_t h = 0; h < e.hf_rope_heads; ++h)
        for (std::size_t i = 0; i < Dh / 2; ++i)
          for (std::size_t pair = 0; pair < 2; ++pair)
            std::copy_n(t.data() + (h * Dh + 2 * i + pair) * cols, cols, u.data() + (h * Dh + pair * Dh / 2 + i) * cols);
      t = u;
    }
    const std::string& name = hf ? e.hf_name : e.gguf_name;
    if (e.split.empty()) {
      file[name] = t;
      continue;
    }
    // Fused: q, k, v side by side along the out axis (columns of a Conv1D, rows otherwise).
    const std::size_t part = e.split == "q" ? 0 : e.split == "k" ? 1 : 2;
    const bool columns = conv1d && t.rank() == 2;
    const std::size_t rows = t.dim(0), cols = t.rank() == 2 ? t.dim(1) : 1;
    Tensor& fused = file[name];
    if (fused.empty())
      fused = Tensor(t.rank() == 1 ? Shape{3 * rows} : columns ? Shape{rows, 3 * cols} : Shape{3 * rows, cols});
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const std::size_t at = columns ? r * 3 * cols + part * cols + c : (part * rows + r) * cols + c;
        fused.data()[at] = t.data()[r * cols + c];
      }
  }
  return file;
}

// Loads the file into a fresh model of the same config and checks every parameter came back.
template <class M, class Config>
void check_round_trip(const M& model, const Config& config, std::span<const ForeignTensor> map, bool hf) {
  CAPTURE(hf);
  const auto file = foreign_file(model, map, hf);
  Config other = config;
  other.seed = config.seed + 1;
  M loaded(other);
  load_foreign_tensors(loaded, map, [&](const ForeignTensor& e) { return file.at(hf ? e.hf_name : e.gguf_name); }, hf);
  const ParameterList a = model.params(), b = loaded.params();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].name);
    CHECK(values(a[i].var.value()) == values(b[i].var.value()));
  }
}
}  // namespace

TEST_CASE("llama's foreign tensor table names every parameter once, in order, and loads Hugging Face and GGUF layouts") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    LlamaConfig c = test::small_llama_config(tied);
    Llama model(c);
    const auto map = llama_foreign_tensors(c);
    const ParameterList params = model.params();
    REQUIRE(map.size() == params.size());
    for (std::size_t i = 0; i < map.size(); ++i) CHECK(map[i].param == params[i].name);
    CHECK(map[1].hf_name == "model.layers.0.input_layernorm.weight");
    CHECK(map[2].hf_name == "model.layers.0.self_attn.q_proj.weight");
    CHECK(map[2].gguf_name == "blk.0.attn_q.weight");
    CHECK(map[2].hf_rope_heads == 4);
    CHECK(map[3].hf_rope_heads == 2);  // k: the KV heads
    CHECK(map[7].gguf_name == "blk.0.ffn_gate.weight");
    CHECK(map.back().gguf_name == (tied ? "output_norm.weight" : "output.weight"));
    check_round_trip(model, c, map, true);
    check_round_trip(model, c, map, false);
  }
}

TEST_CASE("gpt2's foreign tensor table splits the fused attention and loads Hugging Face Conv1D and GGUF layouts") {
  Gpt2Config c{.vocab = 11, .d_model = 8, .n_heads = 2, .n_blocks = 2, .max_len = 6};
  Gpt2 model(c);
  const auto map = gpt2_foreign_tensors(c);
  const ParameterList params = model.params();
  REQUIRE(map.size() == params.size());
  for (std::size_t i = 0; i < map.size(); ++i) CHECK(map[i].param == params[i].name);
  CHECK(map[4].param == "blocks.0.attn.wq.weight");
  CHECK(map[4].hf_name == "transformer.h.0.attn.c_attn.weight");
  CHECK(map[4].gguf_name == "blk.0.attn_qkv.weight");
  CHECK(map[4].split == "q");
  CHECK(map[4].hf_conv1d);
  check_round_trip(model, c, map, true);
  check_round_trip(model, c, map, false);
}

TEST_CASE("load_foreign_tensors names both tensors and both shapes when one does not fit") {
  LlamaConfig c = test::small_llama_config();
  Llama model(c);
  const auto map = llama_foreign_tensors(c);
  auto fetch = [](const ForeignTensor& e) {
    return e.param == "blocks.0.attn.wk.weight" ? Tensor({16, 16}) : Tensor({1});
  };
  std::vector<ForeignTensor> one = {map[3]};
  CHECK(test::error_of([&] { load_foreign_tensors(model, one, fetch, false); }) ==
        "load_foreign_tensors: blk.0.attn_k.weight [16, 16] gives [16, 16] for blocks.0.attn.wk.weight [16, 8]");
  std::vector<ForeignTensor> unknown = {{"blocks.9.attn.wq.weight", "x", "y"}};
  CHECK(test::error_of([&] { load_foreign_tensors(model, unknown, fetch, true); }) ==
        "load_foreign_tensors: the model has no parameter 'blocks.9.attn.wq.weight' (for x)");
}

// ---- the tiny checkpoints of tests/data/models against transformers -------------------------

namespace {

const std::string kModels = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/models/";
const std::vector<std::int32_t> kReferenceIds = {1, 5, 17, 42, 99, 7};

// transformers 5.25's logits (float32, CPU) for kReferenceIds: the first 6 of each position's
// 320, and the sum of all 6 x 320 in double, from the models' own folders.
struct ReferenceLogits {
  std::vector<std::vector<float>> first;
  double sum;
};

// Loads a model from its Hugging Face folder and from its f32 GGUF, and checks both forwards.
template <class M, class Config>
void check_against_transformers(const Config& config, const std::vector<ForeignTensor>& map, const std::string& folder,
                                const std::string& gguf_name, const ReferenceLogits& want) {
  const io::HfFolder hf = io::read_hf_folder(kModels + folder);
  M from_hf(config);
  load_foreign_tensors(from_hf, map, [&](const ForeignTensor& e) { return hf.tensors.at(e.hf_name); }, true);
  std::vector<std::pair<std::string, const M*>> models = {{"hf", &from_hf}};
  std::optional<M> from_gguf;
  if (!gguf_name.empty()) {
    const io::GgufFile gguf = io::GgufFile::open(kModels + folder + "/" + gguf_name);
    from_gguf.emplace(config);
    load_foreign_tensors(*from_gguf, map, [&](const ForeignTensor& e) {
      const io::GgufTensor* t = gguf.find_tensor(e.gguf_name);
      REQUIRE_MESSAGE(t != nullptr, e.gguf_name);
      return gguf.dequantize(*t);
    }, false);
    models.emplace_back("gguf", &*from_gguf);
  }
  for (const auto& [source, model] : models) {
    CAPTURE(source);
    NoGradScope no_grad;
    const Tensor logits = model->forward(kReferenceIds, 1, kReferenceIds.size()).value();
    const std::size_t vocab = config.vocab;
    double sum = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) sum += logits.data()[i];
    CHECK(sum == doctest::Approx(want.sum).epsilon(1e-4));
    for (std::size_t t = 0; t < kReferenceIds.size(); ++t)
      for (std::size_t j = 0; j < 6; ++j)
        CHECK(logits.data()[t * vocab + j] == doctest::Approx(want.first[t][j]).epsilon(1e-4).scale(1));
  }
}

}  // namespace

TEST_CASE("tiny Llama checkpoints, Hugging Face (rotate-half q, k) and GGUF, give transformers' logits") {
  LlamaConfig c{.vocab = 320, .d_model = 32, .n_heads = 4, .n_blocks = 2, .max_len = 128};
  c.n_kv_heads = 2, c.head_dim = 8, c.d_ff = 64, c.norm_eps = 1e-5f, c.rope_theta = 10000.0;
  check_against_transformers<Llama>(c, llama_foreign_tensors(c), "tiny_llama", "tiny_llama.f32.gguf",
                                    {{{-0.1181732f, -0.4143365f, -0.4892655f, -0.3503728f, 1.076279f, -0.1171696f},
                                      {-0.008082982f, -0.577803f, 0.1243573f, -0.6340492f, 0.5575126f, -1.506152f},
                                      {-1.398099f, -1.20945f, 1.073225f, 0.3375805f, 0.8392588f, -1.128124f},
                                      {-0.4833845f, -1.981786f, 1.446607f, -0.8444771f, 1.396462f, 0.0186469f},
                                      {-0.7077565f, -1.645469f, 1.275074f, -0.6122885f, 1.406806f, -1.060376f},
                                      {-0.4499232f, -1.182093f, 1.440458f, -0.1104779f, 0.6529248f, -1.438622f}},
                                     -73.20045210229});
  // Tied, one KV head for all four, rope_theta 1e5, weights in two shards.
  c.n_kv_heads = 1, c.rope_theta = 100000.0, c.tied_head = true;
  check_against_transformers<Llama>(c, llama_foreign_tensors(c), "tiny_llama_tied", "",
                                    {{{-0.1369438f, 0.3940337f, 0.6311578f, -0.9680315f, -1.117134f, -0.5980538f},
                                      {-0.2486686f, 1.774036f, -0.1430521f, -0.6819983f, -1.723452f, 0.5869032f},
                                      {0.4117782f, 0.6102925f, 1.556869f, -0.4151566f, -1.04998f, -0.6555296f},
                                      {-0.3289812f, 1.264033f, 0.4169266f, -0.8344194f, -0.1021916f, -1.680106f},
                                      {0.1227149f, 1.12864f, 1.199406f, 0.1171332f, -0.01850148f, -2.04033f},
                                      {0.3719477f, 0.9079487f, 2.439954f, 0.8630403f, 0.0634453f, -1.482386f}},
                                     44.81639088271186});
}

TEST_CASE("a tiny GPT-2 checkpoint, Hugging Face (Conv1D, fused c_attn, float16) and GGUF, gives transformers' logits") {
  Gpt2Config c{.vocab = 320, .d_model = 32, .n_heads = 4, .n_blocks = 2, .max_len = 128};
  check_against_transformers<Gpt2>(c, gpt2_foreign_tensors(c), "tiny_gpt2", "tiny_gpt2.f32.gguf",
                                   {{{0.6719739f, 0.3267182f, -0.8763618f, 1.068112f, -0.2295077f, 1.032875f},
                                     {0.6078703f, -1.247954f, -1.587054f, 1.14826f, -1.09537f, 1.231948f},
                                     {-0.1233067f, -1.508524f, -1.776654f, 0.654534f, -1.153545f, 0.7444027f},
                                     {0.1856149f, -0.4010801f, -0.7793922f, 0.4694148f, -0.368716f, 0.3668602f},
                                     {0.7575115f, -0.9750152f, -0.778183f, 0.3866806f, -0.3165107f, -0.3923814f},
                                     {0.308194f, -0.03686552f, -0.823481f, 0.8131719f, -1.042902f, 0.7800002f}},
                                    10.123687874292955});
}
