# Writes OUTPUT, a C++ source defining `std::string_view tapegrad::serve::NAME()` that returns the
# bytes of INPUT: a file embedded into a program at build time (cmake -DINPUT= -DOUTPUT= -DNAME= -P).
file(READ "${INPUT}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} by cmake/embed_file.cmake; do not edit.\n"
  "#include <string_view>\n"
  "namespace tapegrad::serve {\n"
  "static const unsigned char ${NAME}_bytes[] = {${bytes}0};\n"
  "std::string_view ${NAME}() { return {reinterpret_cast<const char*>(${NAME}_bytes), sizeof ${NAME}_bytes - 1}; }\n"
  "}  // namespace tapegrad::serve\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
