// The registry of architectures, the built-in ones first, and the name it gives a LanguageModel's
// model.
#include "nn/architecture.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace tapegrad::nn {

// The built-in architectures, each defined in its model's file; this is the only list of them.
// (A static registrar in each file would be dropped by the linker from a static library whose
// program never names that file's symbols.)
Architecture rotary_architecture();
Architecture gpt2_architecture();
Architecture llama_architecture();

namespace {

std::vector<Architecture>& registry() {
  static std::vector<Architecture> architectures{rotary_architecture(), gpt2_architecture(),
                                                    llama_architecture()};
  return architectures;
}

}  // namespace

void register_architecture(Architecture architecture) {
  for (const Architecture& a : registry())
    if (a.name == architecture.name || a.model_type == architecture.model_type)
      throw std::invalid_argument(fmt::format("register_architecture: '{}' clashes with the registered '{}' (same {})",
                                              architecture.name, a.name,
                                              a.name == architecture.name ? "name" : "model class"));
  registry().push_back(std::move(architecture));
}

const Architecture& find_architecture(const std::string& name, const std::string& what) {
  for (const Architecture& a : registry())
    if (a.name == name) return a;
  throw std::invalid_argument(fmt::format("{} '{}' is not a registered architecture (registered: {})", what, name,
                                          fmt::join(architecture_names(), ", ")));
}

const Architecture* find_architecture(std::type_index model_type) {
  for (const Architecture& a : registry())
    if (a.model_type == model_type) return &a;
  return nullptr;
}

std::string LanguageModel::arch() const {
  const Architecture* arch = find_architecture(model_type());
  if (!arch)
    throw std::logic_error(fmt::format("LanguageModel: the model's class {} is not a registered architecture "
                                       "(registered: {}); call register_architecture first",
                                       model_type().name(), fmt::join(architecture_names(), ", ")));
  return arch->name;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture& a : registry()) names.push_back(a.name);
  return names;
}

}  // namespace tapegrad::nn
