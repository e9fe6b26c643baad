#include <catch2/catch.hpp>

#include <cstdlib>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>

#include "common/error.h"
#include "common/log.h"

namespace {

struct Captured {
  std::ostringstream out;
  spdlog::sink_ptr sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
};

}  // namespace

TEST_CASE("every log line carries the rank and role", "[common][log]") {
  unsetenv("TANDEM_LOG_LEVEL");
  Captured c;
  tandem::log::init("info", c.sink);
  spdlog::info("loaded {} layers", 28);
  tandem::log::set_identity(3, "decode");
  spdlog::warn("pool is {}% full", 95);
  const std::string text = c.out.str();
  CHECK_THAT(text, Catch::Contains("[rank 0 main] [info] loaded 28 layers"));
  CHECK_THAT(text, Catch::Contains("[rank 3 decode] [warning] pool is 95% full"));
}

TEST_CASE("the config level filters, and TANDEM_LOG_LEVEL wins over it", "[common][log]") {
  unsetenv("TANDEM_LOG_LEVEL");
  {
    Captured c;
    tandem::log::init("warn", c.sink);
    spdlog::info("hidden");
    spdlog::error("shown");
    CHECK(c.out.str().find("hidden") == std::string::npos);
    CHECK_THAT(c.out.str(), Catch::Contains("shown"));
    CHECK(tandem::log::current_level() == "warn");
  }
  {
    setenv("TANDEM_LOG_LEVEL", "debug", 1);
    Captured c;
    tandem::log::init("error", c.sink);
    spdlog::debug("visible through the environment");
    CHECK_THAT(c.out.str(), Catch::Contains("visible through the environment"));
    CHECK(tandem::log::current_level() == "debug");
    unsetenv("TANDEM_LOG_LEVEL");
  }
}

TEST_CASE("an unknown level is one clear error naming its source", "[common][log]") {
  setenv("TANDEM_LOG_LEVEL", "loud", 1);
  CHECK_THROWS_WITH(tandem::log::init("info"),
                    "TANDEM_LOG_LEVEL: unknown log level 'loud'; use one of trace, debug, info, warn, error, off");
  unsetenv("TANDEM_LOG_LEVEL");
  CHECK_THROWS_WITH(tandem::log::init("chatty"), Catch::StartsWith("log.level: unknown log level 'chatty'"));
}
