// JSON answers and OpenAI-shaped errors of the HTTP shim.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// A list query's `limit`: `fallback` when absent; -1 when it is not a whole number from 1 to max.
inline int64_t list_limit(const httplib::Request& req, int64_t fallback, int64_t max) {
  if (!req.has_param("limit")) return fallback;
  const std::string v = req.get_param_value("limit");
  try {
    std::size_t used = 0;
    const int64_t limit = std::stoll(v, &used);
    return used == v.size() && limit >= 1 && limit <= max ? limit : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// OpenAI's cursor page over items (each with an `id`), in their order: the
// ones after the item `after` names (from the first when empty) that `keep`
// takes, at most `limit`, with has_more, first_id and last_id; nullopt when
// `after` names none of them.
template <class T, class ToJson, class Keep>
std::optional<nlohmann::json> list_page(const std::vector<T>& items, const std::string& after, int64_t limit,
                                        ToJson to_json, Keep keep) {
  nlohmann::json data = nlohmann::json::array();
  bool past = after.empty(), more = false;
  for (const auto& item : items) {
    if (!past) {
      past = item.id == after;
      continue;
    }
    if (!keep(item)) continue;
    if (static_cast<int64_t>(data.size()) == limit) {
      more = true;
      break;
    }
    data.push_back(to_json(item));
  }
  if (!past) return std::nullopt;
  nlohmann::json body{{"object", "list"}, {"data", data}, {"has_more", more}};
  body["first_id"] = data.empty() ? nlohmann::json(nullptr) : data.front()["id"];
  body["last_id"] = data.empty() ? nlohmann::json(nullptr) : data.back()["id"];
  return body;
}

}  // namespace tandem::launcher
