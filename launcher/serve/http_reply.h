// JSON answers and OpenAI-shaped errors of the HTTP shim.
#pragma once

#include <httplib.h>

#include <string>

#include <nlohmann/json.hpp>

#include "router/openai_stream.h"

namespace tandem::launcher {

inline void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

inline void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                       const std::string& code = "", const std::string& param = "") {
  send_json(res, status, router::error_body(message, type, code, param));
}

}  // namespace tandem::launcher
