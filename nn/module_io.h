// Saving and loading any Module's named parameters as safetensors, with the
// caller's metadata, through the same hardened reader as the model checkpoints.
#pragma once

#include <map>
#include <string>

#include "nn/module.h"

namespace tapegrad::nn {

/// Writes every parameter under its name, and metadata in "__metadata__", atomically.
void save_module(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata = {});

/// Reads path into module's parameters (each must be present with its exact shape and finite
/// values; a tensor the module does not have is an error) and returns the metadata. On any
/// error the module is left unchanged and the message names the file and the problem.
std::map<std::string, std::string> load_module(const std::string& path, Module& module);

}  // namespace tapegrad::nn
