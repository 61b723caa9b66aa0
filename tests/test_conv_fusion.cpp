// Placeholder: filled by the demo part of issue 15.
#include <doctest/doctest.h>
