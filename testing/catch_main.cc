// The one Catch2 main every cc_test links.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
