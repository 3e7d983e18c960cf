// export_final_model: the run's model, tokenizer and chat template to nn::export_hf and export_gguf;
// check_final_model_exportable: the same exports refused before the run trains.
#include "training/model_export.h"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

#include "cli/program.h"
#include "nn/export.h"

namespace tapegrad::examples {

void check_final_model_exportable(const TrainOptions& o, const Run& run) {
  const nn::ExportSource source{run.model, *run.corpus.tokenizer, run.chat_template};
  for (const auto& [flag, target] :
       {std::pair{"--export-hf", o.export_hf}, std::pair{"--export-gguf", o.export_gguf}}) {
    if (target.empty()) continue;
    try {
      nn::check_exportable(source, target);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{} {}", flag, e.what()));
    }
  }
}

void export_final_model(const TrainOptions& o, const Run& run) {
  const nn::ExportSource source{run.model, *run.corpus.tokenizer, run.chat_template};
  const char* template_note = run.chat_template ? "with its chat template" : "without a chat template";
  if (!o.export_hf.empty()) {
    nn::export_hf(source, o.export_hf);
    fmt::print("exported {} (a Hugging Face folder, float32, {})\n", o.export_hf, template_note);
  }
  if (!o.export_gguf.empty()) {
    nn::export_gguf(source, o.export_gguf, nn::parse_gguf_export_type(o.export_type));
    fmt::print("exported {} (GGUF, {} matrices, {})\n", o.export_gguf, o.export_type, template_note);
  }
  std::fflush(stdout);
}

}  // namespace tapegrad::examples
