// The trainer's --export-hf and --export-gguf: the final model of a run written as a Hugging Face
// folder and a GGUF file (nn/export.h), with the run's tokenizer and the --init file's chat template.
#pragma once

#include "training/trainer.h"
#include "training/training_run.h"

namespace tapegrad::examples {

/// Throws a UsageError naming the flag when o.export_hf or o.export_gguf asks for a model or
/// tokenizer the exporter does not write: checked before the first step, so nothing is written.
void check_final_model_exportable(const TrainOptions& o, const Run& run);

/// Writes what o.export_hf and o.export_gguf ask for (nothing when both are empty) and logs each
/// path; an export that cannot be written throws naming it (the checkpoint is already saved).
void export_final_model(const TrainOptions& o, const Run& run);

}  // namespace tapegrad::examples
