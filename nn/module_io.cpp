// save_module / load_module on core/safetensors.
#include "nn/module_io.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"

namespace tapegrad::nn {

void save_module(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata) {
  ParameterList params = module.params();
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& p : params) tensors.emplace_back(p.name, &p.var.value());
  write_safetensors(path, tensors, metadata);
}

std::map<std::string, std::string> load_module(const std::string& path, Module& module) {
  SafetensorsFile file = read_safetensors(path);
  ParameterList params = module.params();
  try {
    std::set<std::string> names;
    for (const auto& p : params) {
      names.insert(p.name);
      auto it = file.tensors.find(p.name);
      if (it == file.tensors.end()) throw std::runtime_error(fmt::format("tensor '{}' is missing", p.name));
      if (it->second.shape() != p.var.shape())
        throw std::runtime_error(fmt::format("tensor '{}' has shape {} but the module's parameter is {}", p.name,
                                             to_string(it->second.shape()), to_string(p.var.shape())));
      for (std::size_t i = 0; i < it->second.size(); ++i)
        if (!std::isfinite(it->second[i]))
          throw std::runtime_error(fmt::format("tensor '{}' holds {} at element {}", p.name, it->second[i], i));
    }
    for (const auto& [name, tensor] : file.tensors)
      if (!names.count(name)) throw std::runtime_error(fmt::format("tensor '{}' is not a parameter of this module", name));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
  for (auto& p : params) p.var.mutable_value() = std::move(file.tensors.at(p.name));  // all checked: no partial load
  return file.metadata;
}

}  // namespace tapegrad::nn
