// The one doctest main of the suite (kept apart: it is the slowest translation unit to compile).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
