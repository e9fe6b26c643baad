#include "launcher/config/load.h"

#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "common/error.h"
#include "common/text.h"
#include "launcher/config/schema.h"

namespace tandem::launcher {
namespace {

std::string where(std::string_view source, const toml::source_region& r) {
  return std::string(source) + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

std::string describe(const toml::node& node) {
  std::ostringstream os;
  switch (node.type()) {
    case toml::node_type::string: os << "the string \"" << *node.value<std::string>() << "\""; break;
    case toml::node_type::integer: os << "the integer " << *node.value<int64_t>(); break;
    case toml::node_type::floating_point: os << "the number " << *node.value<double>(); break;
    case toml::node_type::boolean: os << (*node.value<bool>() ? "true" : "false"); break;
    case toml::node_type::table: os << "a table"; break;
    case toml::node_type::array: os << "an array"; break;
    default: os << "a date or time"; break;
  }
  return os.str();
}

// The node's value as spec's kind, or nullopt when its TOML type does not fit.
std::optional<Value> convert(const KeySpec& spec, const toml::node& node) {
  switch (spec.kind) {
    case ValueKind::kBool:
      if (auto b = node.value_exact<bool>()) return Value(*b);
      break;
    case ValueKind::kInt:
      if (auto i = node.value_exact<int64_t>()) return Value(*i);
      break;
    case ValueKind::kFloat:
      if (node.is_number()) return Value(*node.value<double>());
      break;
    case ValueKind::kString:
      if (auto s = node.value_exact<std::string>()) return Value(*s);
      break;
  }
  return std::nullopt;
}

std::string example(const KeySpec& spec, const Config& defaults) {
  return " (e.g. " + spec.name + " = " + format_value(spec.get(defaults)) + ")";
}

// Validates value for spec and stores it; `at` prefixes any error.
void assign(Config& config, const KeySpec& spec, const Value& value, const std::string& at) {
  if (auto why = check_value(spec, value); !why.empty())
    throw Error(at + ": " + spec.full_name() + " " + why);
  // A key that does not act yet is refused at anything but its default, never accepted and ignored.
  if (const std::string plain = format_value(spec.get(Config{})); !spec.pending.empty() && format_value(value) != plain)
    throw Error(at + ": " + spec.full_name() + " = " + format_value(value) + " does not act yet (pending for " +
                spec.pending + "); remove it or leave it at " + plain);
  spec.set(config, value);
}

std::string unknown_section(std::string_view name) {
  std::string msg = "unknown section [" + std::string(name) + "]";
  if (auto near = closest_match(name, section_names())) msg += "; did you mean [" + *near + "]?";
  else msg += "; sections are model, job, cluster, router, planner, kv, transport, http, log";
  return msg;
}

std::string unknown_key(std::string_view section, std::string_view name) {
  std::string msg = "unknown key '" + std::string(name) + "' in [" + std::string(section) + "]";
  if (auto near = closest_match(name, key_names(section))) msg += "; did you mean '" + *near + "'?";
  else msg += "; see docs/config.md for the keys of [" + std::string(section) + "]";
  return msg;
}

void apply_table(Config& config, const toml::table& root, std::string_view source) {
  const Config defaults;
  for (auto&& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const auto* table = section_node.as_table();
    if (section == "defaults") {  // free-form: request fields, checked as a line's (router/body_defaults.h)
      if (!table)
        throw Error(where(source, section_key.source()) + ": 'defaults' must be a section ([defaults]) of request "
                    "fields, got " + describe(section_node));
      std::ostringstream json;
      json << toml::json_formatter{*table};
      config.defaults = json.str();
      config.defaults_source = where(source, section_key.source()) + ": [defaults]";
      continue;
    }
    if (key_names(section).empty()) {
      throw Error(where(source, section_key.source()) + ": " + unknown_section(section));
    }
    if (!table) {
      throw Error(where(source, section_key.source()) + ": '" + section +
                  "' must be a section ([" + section + "]), got " + describe(section_node));
    }
    for (auto&& [k, node] : *table) {
      const std::string name(k.str());
      const KeySpec* spec = find_key(section, name);
      if (!spec) throw Error(where(source, k.source()) + ": " + unknown_key(section, name));
      const std::string at = where(source, node.source());
      auto value = convert(*spec, node);
      if (!value) {
        throw Error(at + ": " + spec->full_name() + " must be " + std::string(kind_name(spec->kind)) +
                    ", got " + describe(node) + example(*spec, defaults));
      }
      assign(config, *spec, *value, at);
    }
  }
}

void apply_override(Config& config, const std::string& arg) {
  const std::string at = "--set " + arg;
  const auto eq = arg.find('=');
  const auto dot = arg.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw Error(at + ": expected section.key=value, e.g. --set kv.block_size=32");
  }
  const std::string section = arg.substr(0, dot);
  const std::string name = arg.substr(dot + 1, eq - dot - 1);
  const std::string text = arg.substr(eq + 1);
  if (key_names(section).empty()) throw Error(at + ": " + unknown_section(section));
  const KeySpec* spec = find_key(section, name);
  if (!spec) throw Error(at + ": " + unknown_key(section, name));

  Value value;
  if (spec->kind == ValueKind::kString) {
    // Shell users write --set model.path=/data/m; quotes are optional.
    value = text;
    if (text.size() >= 2 && text.front() == '"' && text.back() == '"') value = text.substr(1, text.size() - 2);
  } else {
    toml::table parsed;
    std::optional<Value> converted;
    try {
      parsed = toml::parse("v = " + text);
      converted = convert(*spec, *parsed.get("v"));
    } catch (const toml::parse_error&) {
    }
    if (!converted) {
      throw Error(at + ": " + spec->full_name() + " must be " + std::string(kind_name(spec->kind)) +
                  ", got \"" + text + "\"");
    }
    value = *converted;
  }
  assign(config, *spec, value, at);
}

}  // namespace

Config parse_config(std::string_view toml_text, std::string_view source_name,
                    const std::vector<std::string>& overrides) {
  Config config;
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    throw Error(where(source_name, e.source()) + ": TOML syntax error: " + std::string(e.description()));
  }
  apply_table(config, root, source_name);
  for (const auto& o : overrides) apply_override(config, o);
  resolve_choices(config);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "(defaults)", overrides);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the config file; check the path given to -c");
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_config(buf.str(), path, overrides);
}

std::string to_toml(const Config& config) {
  std::string out;
  if (!config.defaults.empty()) out += "# [defaults] (" + config.defaults_source + "), as JSON: " + config.defaults + "\n";
  std::string section;
  for (const auto& spec : schema()) {
    if (spec.section != section) {
      section = spec.section;
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
    }
    out += spec.name + " = " + format_value(spec.get(config)) + "\n";
  }
  return out;
}

std::string reference_markdown() {
  const Config defaults;
  std::string out =
      "# Configuration reference\n\n"
      "<!-- Generated by `tandem config --reference`; a unit test keeps this file equal to it. -->\n\n"
      "A job is configured by one TOML file (`tandem run -c job.toml`) and `--set section.key=value`\n"
      "overrides, applied in order after the file. Every key is optional; the defaults are below.\n"
      "An unknown key, a value of the wrong type or out of range stops Tandem before any rank\n"
      "starts work, with one line naming the file, line, column and key. `tandem config -c job.toml`\n"
      "checks a file and prints the effective configuration.\n\n"
      "Keys marked *pending* are validated today and act once the named feature lands, so job files\n"
      "written now keep working.\n";
  std::string section;
  for (const auto& spec : schema()) {
    if (spec.section != section) {
      section = spec.section;
      out += "\n## [" + section + "]\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    std::string type;
    switch (spec.kind) {
      case ValueKind::kBool: type = "bool"; break;
      case ValueKind::kInt: type = "integer"; break;
      case ValueKind::kFloat: type = "number"; break;
      case ValueKind::kString: type = "string"; break;
    }
    if (!spec.choices.empty()) {
      type.clear();
      for (const auto& c : spec.choices) type += (type.empty() ? "" : " \\| ") + ("`" + c + "`");
    }
    if (spec.min || spec.max) {
      auto num = [&](double v) {
        Value b = spec.kind == ValueKind::kInt ? Value(static_cast<int64_t>(v)) : Value(v);
        return format_value(b);
      };
      type += spec.min && spec.max ? ", " + num(*spec.min) + "–" + num(*spec.max)
              : spec.min          ? ", ≥ " + num(*spec.min)
                                  : ", ≤ " + num(*spec.max);
    }
    std::string doc = spec.doc;
    if (!spec.pending.empty()) doc += " *Pending: " + spec.pending + ".*";
    out += "| `" + spec.name + "` | " + type + " | `" + format_value(spec.get(defaults)) + "` | " + doc + " |\n";
  }
  return out;
}

void resolve_choices(Config& c) {
  // The schema allowed only these names.
  c.choices.mode = c.job.mode == "agg" ? JobMode::kAgg : c.job.mode == "auto" ? JobMode::kAuto : JobMode::kDisagg;
  c.choices.backend = c.model.backend == "cuda" ? ComputeBackend::kCuda : ComputeBackend::kCpu;
  const std::string& t = c.transport.backend;
  c.choices.transport = t == "mpi_rma"         ? TransportKind::kMpiRma
                        : t == "mpi_two_sided" ? TransportKind::kMpiTwoSided
                        : t == "nccl"          ? TransportKind::kNccl
                        : t == "libfabric"     ? TransportKind::kLibfabric
                                               : TransportKind::kAuto;
  c.choices.output_order = c.job.output_order == "input" ? OutputOrder::kInput : OutputOrder::kCompletion;
  c.choices.placement = c.cluster.placement == "rank" ? Placement::kRank : Placement::kNode;
}

const char* transport_name(TransportKind t) {
  switch (t) {
    case TransportKind::kMpiRma: return "mpi_rma";
    case TransportKind::kMpiTwoSided: return "mpi_two_sided";
    case TransportKind::kNccl: return "nccl";
    case TransportKind::kLibfabric: return "libfabric";
    default: return "auto";
  }
}

}  // namespace tandem::launcher
