// Placeholder: filled by its part of issue 15.
#include <doctest/doctest.h>
