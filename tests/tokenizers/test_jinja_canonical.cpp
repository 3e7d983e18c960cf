// Chat templates recognised by their canonical form, whatever their Jinja spelling.
#include <doctest/doctest.h>

#include "support/helpers.h"
#include "tokenizers/jinja_canonical.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

TEST_CASE("a template's canonical form is its output text and tags whatever the spelling") {
  CHECK(jinja_canonical("{{ 'a' + \"b\\n\" }}x") == "out 'ab\\n" "x'\n");
  CHECK(jinja_canonical("{{ message.role }}") == jinja_canonical("{{message['role']}}"));
  CHECK(jinja_canonical("{% if x %}\n  y\n{% endif %}") == "do if x\nout '  y\\n'\ndo endif\n");  // trim_blocks
  CHECK(jinja_canonical("a  {%- if x -%}  \n b{# note #}") == "out 'a'\ndo if x\nout 'b'\n");
  CHECK(jinja_canonical("a\n    {% if x %}") == "out 'a\\n'\ndo if x\n");  // lstrip_blocks
  CHECK(jinja_canonical("a\n    {%+ if x %}") == "out 'a\\n    '\ndo if x\n");
  CHECK(jinja_canonical("{{ 'it\\'s' }}") == "out 'it\\'s'\n");
  CHECK(test::contains(test::error_of([] { jinja_canonical("{% if x"); }), "the tag at offset 0 is not closed"));
}
