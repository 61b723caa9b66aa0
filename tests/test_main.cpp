// The doctest runner shared by every test executable (compiled once into a static library).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
