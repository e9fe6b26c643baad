#include <catch2/catch.hpp>

#include "common/status.h"

using tandem::Status;
using tandem::StatusCode;

namespace {
Status fails() { return Status(StatusCode::kResourceExhausted, "no free KV blocks"); }
Status calls_fails() {
  TANDEM_RETURN_IF_ERROR(fails());
  return Status();
}
Status calls_ok() {
  TANDEM_RETURN_IF_ERROR(Status());
  return Status(StatusCode::kNotFound, "reached the end");
}
}  // namespace

TEST_CASE("Status propagates with the file and line it passed through", "[common]") {
  Status s = calls_fails();
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::StartsWith("no free KV blocks [at status_test.cpp:"));
  CHECK_THAT(s.to_string(), Catch::StartsWith("resource exhausted: no free KV blocks"));
}

TEST_CASE("TANDEM_RETURN_IF_ERROR lets an ok status through", "[common]") {
  Status s = calls_ok();
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message() == "reached the end");
  CHECK(Status().ok());
  CHECK(Status().to_string() == "ok");
}
