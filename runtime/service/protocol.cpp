#include "runtime/service/protocol.h"

#include <cstring>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tandem::service {

std::string_view msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kRequest: return "request";
    case MsgType::kResult: return "result";
    case MsgType::kShutdown: return "shutdown";
    case MsgType::kReport: return "report";
    case MsgType::kPrefill: return "prefill";
    case MsgType::kCancel: return "cancel";
    case MsgType::kCacheEvents: return "cache-events";
    case MsgType::kDeltas: return "deltas";
    case MsgType::kStats: return "stats";
    case MsgType::kRoles: return "roles";
    case MsgType::kGroupForward: return "group-forward";
    case MsgType::kGroupPostKv: return "group-post-kv";
    case MsgType::kGroupReleaseKv: return "group-release-kv";
    case MsgType::kGroupAwaitKv: return "group-await-kv";
    case MsgType::kGroupStop: return "group-stop";
    case MsgType::kGroupSaveBlocks: return "group-save-blocks";
    case MsgType::kGroupLoadBlocks: return "group-load-blocks";
    case MsgType::kRegroup: return "regroup";
    case MsgType::kGroupMap: return "group-map";
    case MsgType::kGroupMapAck: return "group-map-ack";
    case MsgType::kPing: return "ping";
  }
  return "unknown";
}

std::string_view role_name(Role r) {
  switch (r) {
    case Role::kWorker: return "worker";
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
    case Role::kRouter: return "router";
  }
  return "unknown";
}

nlohmann::json tiers_json(const kv::TierStats& t) {
  nlohmann::json j = nlohmann::json::object();
  kv::TierStats::each_field([&](const char* name, auto member) { j[name] = t.*member; });
  return j;
}

kv::TierStats tiers_from_json(const nlohmann::json& j) {
  kv::TierStats t;
  kv::TierStats::each_field([&](const char* name, auto member) {
    t.*member = j.at(name).get<std::remove_reference_t<decltype(t.*member)>>();
  });
  return t;
}

namespace {

using json = nlohmann::json;

// A step on the wire: [prefill tokens, prefill context, decode sequences, decode context, logit rows, seconds].
json steps_json(const std::vector<runtime::StepSample>& steps) {
  json out = json::array();
  for (const auto& s : steps)
    out.push_back({s.shape.prefill_tokens, s.shape.prefill_ctx, s.shape.decode_seqs, s.shape.decode_ctx,
                   s.shape.logit_rows, s.seconds});
  return out;
}

std::vector<runtime::StepSample> steps_from_json(const json& j) {
  std::vector<runtime::StepSample> out;
  for (const auto& v : j) {
    const auto a = v.get<std::array<double, 6>>();
    out.push_back({{a[0], a[1], a[2], a[3], a[4]}, a[5]});
  }
  return out;
}

json params_json(const runtime::SamplingParams& p) {
  return {{"max_tokens", p.max_tokens},   {"temperature", p.temperature},
          {"top_p", p.top_p},             {"top_k", p.top_k},
          {"min_p", p.min_p},             {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty}, {"repetition_penalty", p.repetition_penalty},
          {"seed", p.seed},               {"stop_token_ids", p.stop_token_ids},
          {"stop", p.stop},               {"ignore_eos", p.ignore_eos},
          {"logprobs", p.logprobs},       {"prompt_logprobs", p.prompt_logprobs},
          {"logit_bias", p.logit_bias},   {"min_tokens", p.min_tokens},
          {"grammar", p.grammar}};
}

runtime::SamplingParams params_from(const json& j) {
  runtime::SamplingParams p;
  p.max_tokens = j.at("max_tokens");
  p.temperature = j.at("temperature");
  p.top_p = j.at("top_p");
  p.top_k = j.at("top_k");
  p.min_p = j.at("min_p");
  p.presence_penalty = j.at("presence_penalty");
  p.frequency_penalty = j.at("frequency_penalty");
  p.repetition_penalty = j.at("repetition_penalty");
  p.seed = j.at("seed");
  p.stop_token_ids = j.at("stop_token_ids").get<std::vector<int32_t>>();
  p.stop = j.at("stop").get<std::vector<std::string>>();
  p.ignore_eos = j.at("ignore_eos");
  p.logprobs = j.at("logprobs");
  p.prompt_logprobs = j.at("prompt_logprobs");
  p.logit_bias = j.at("logit_bias").get<std::vector<std::pair<int32_t, float>>>();
  p.min_tokens = j.at("min_tokens");
  p.grammar = j.at("grammar").get<std::string>();
  return p;
}

json logprobs_json(const std::vector<runtime::PositionLogprobs>& v) {
  json out = json::array();
  for (const auto& p : v) {
    json top = json::array();
    for (const auto& t : p.top) top.push_back({t.token, t.logprob});
    out.push_back({p.chosen.token, p.chosen.logprob, top});
  }
  return out;
}

std::vector<runtime::PositionLogprobs> logprobs_from(const json& j) {
  std::vector<runtime::PositionLogprobs> out;
  for (const auto& p : j) {
    runtime::PositionLogprobs lp;
    lp.chosen = {p[0].get<int32_t>(), p[1].get<float>()};
    for (const auto& t : p[2]) lp.top.push_back({t[0].get<int32_t>(), t[1].get<float>()});
    out.push_back(std::move(lp));
  }
  return out;
}

json request_json(const WireRequest& r) {
  json j{{"id", r.id}, {"prompt", r.prompt}, {"params", params_json(r.params)}, {"rng_key", r.rng_key},
         {"prefill_rank", r.prefill_rank}, {"stream", r.stream}};
  if (r.pooling != 0) j["pooling"] = r.pooling, j["inputs"] = r.inputs;
  return j;
}

WireRequest request_from(const json& j) {
  WireRequest r;
  r.id = j.at("id");
  r.prompt = j.at("prompt").get<std::vector<int32_t>>();
  r.params = params_from(j.at("params"));
  r.rng_key = j.at("rng_key");
  r.prefill_rank = j.at("prefill_rank");
  r.stream = j.at("stream");
  if (j.contains("pooling")) {
    r.pooling = j.at("pooling");
    r.inputs = j.at("inputs").get<std::vector<std::vector<int32_t>>>();
  }
  return r;
}

}  // namespace

std::vector<uint8_t> encode(const WireRequest& r) { return json::to_cbor(request_json(r)); }
WireRequest decode_request(const std::vector<uint8_t>& bytes) { return request_from(json::from_cbor(bytes)); }

std::vector<uint8_t> encode(const WireDeltas& r) {
  json d = json::array();
  for (const auto& x : r.deltas) d.push_back({x.id, x.tokens});
  return json::to_cbor(d);
}

WireDeltas decode_deltas(const std::vector<uint8_t>& bytes) {
  WireDeltas r;
  for (const auto& x : json::from_cbor(bytes)) r.deltas.push_back({x[0].get<uint64_t>(), x[1].get<std::vector<int32_t>>()});
  return r;
}

std::vector<uint8_t> encode(const WireRoles& r) {
  return json::to_cbor(json{{"epoch", r.epoch}, {"prefill", r.prefill_ranks}});
}

WireRoles decode_roles(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  return WireRoles{j.at("epoch").get<int64_t>(), j.at("prefill").get<std::vector<int>>()};
}

std::vector<uint8_t> encode(const WireGroupMap& r) {
  json groups = json::array();
  for (const auto& g : r.groups) groups.push_back({g.prefill, g.ranks, g.block_bytes, g.blocks});
  return json::to_cbor(json{{"serial", r.serial}, {"groups", groups}});
}

WireGroupMap decode_group_map(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  WireGroupMap m{j.at("serial").get<int64_t>(), {}};
  for (const auto& g : j.at("groups"))
    m.groups.push_back({g.at(0).get<bool>(), g.at(1).get<std::vector<int>>(), g.at(2).get<uint64_t>(), g.at(3).get<int64_t>()});
  return m;
}

std::vector<uint8_t> encode_id(int64_t id) { return json::to_cbor(json(id)); }
int64_t decode_id(const std::vector<uint8_t>& bytes) { return json::from_cbor(bytes).get<int64_t>(); }

std::vector<uint8_t> encode_blocks(std::span<const int32_t> blocks) {
  std::vector<uint8_t> out(blocks.size_bytes());
  if (!blocks.empty()) std::memcpy(out.data(), blocks.data(), out.size());
  return out;
}

std::vector<int32_t> decode_blocks(const std::vector<uint8_t>& bytes) {
  if (bytes.size() % sizeof(int32_t) != 0)
    throw Error("a block list of " + std::to_string(bytes.size()) + " bytes is not whole block ids (tandem internal error)");
  std::vector<int32_t> out(bytes.size() / sizeof(int32_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<uint8_t> encode(const WireGroupPost& r) {
  return json::to_cbor(json{{"dest", r.dest}, {"src", r.src}, {"dst", r.dst}, {"note", json::binary(r.note)}, {"id", r.id}});
}

WireGroupPost decode_group_post(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  return WireGroupPost{j.at("dest").get<int>(), j.at("src").get<std::vector<int32_t>>(),
                       j.at("dst").get<std::vector<int32_t>>(), j.at("note").get_binary(), j.at("id").get<int64_t>()};
}

std::vector<uint8_t> encode(const WireGroupAwait& r) {
  return json::to_cbor(json{{"source", r.source}, {"note", json::binary(r.note)}});
}

WireGroupAwait decode_group_await(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  return WireGroupAwait{j.at("source").get<int>(), j.at("note").get_binary()};
}

// [chunks] then per chunk [start (low, high 32 bits), tokens, blocks, flags], then each chunk's tokens and blocks.
std::vector<uint8_t> encode_forward(std::span<const runtime::SeqChunk> chunks) {
  std::vector<int32_t> ints{static_cast<int32_t>(chunks.size())};
  for (const auto& c : chunks) {
    const auto start = static_cast<uint64_t>(c.start_pos);
    ints.insert(ints.end(), {static_cast<int32_t>(start & 0xffffffffu), static_cast<int32_t>(start >> 32),
                             static_cast<int32_t>(c.tokens.size()), static_cast<int32_t>(c.block_table.size()),
                             (c.logits_last ? 1 : 0) | (c.logits_all ? 2 : 0)});
  }
  for (const auto& c : chunks) {
    ints.insert(ints.end(), c.tokens.begin(), c.tokens.end());
    ints.insert(ints.end(), c.block_table.begin(), c.block_table.end());
  }
  std::vector<uint8_t> bytes(ints.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), ints.data(), bytes.size());
  return bytes;
}

void decode_forward(const std::vector<uint8_t>& bytes, WireForward& out) {
  auto bad = [] { throw Error("a group-forward message is malformed (tandem internal error; please report it)"); };
  if (bytes.size() % sizeof(int32_t) != 0 || bytes.empty()) bad();
  out.ints.resize(bytes.size() / sizeof(int32_t));
  std::memcpy(out.ints.data(), bytes.data(), bytes.size());
  const std::span<const int32_t> all(out.ints);
  const auto n = static_cast<std::size_t>(all[0]);
  if (all[0] < 0 || all.size() < 1 + 5 * n) bad();
  out.chunks.assign(n, runtime::SeqChunk{});
  std::size_t at = 1 + 5 * n;
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = all.subspan(1 + 5 * i, 5);
    auto& c = out.chunks[i];
    c.start_pos = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(h[0])) |
                                       (static_cast<uint64_t>(static_cast<uint32_t>(h[1])) << 32));
    const auto nt = static_cast<std::size_t>(h[2]), nb = static_cast<std::size_t>(h[3]);
    if (h[2] < 0 || h[3] < 0 || at + nt + nb > all.size()) bad();
    c.tokens = all.subspan(at, nt);
    c.block_table = all.subspan(at + nt, nb);
    c.logits_last = (h[4] & 1) != 0;
    c.logits_all = (h[4] & 2) != 0;
    at += nt + nb;
  }
  if (at != all.size()) bad();
}

std::vector<uint8_t> encode_cancel(uint64_t id) { return json::to_cbor(json(id)); }
uint64_t decode_cancel(const std::vector<uint8_t>& bytes) { return json::from_cbor(bytes).get<uint64_t>(); }

std::vector<uint8_t> encode(const WireCacheEvents& r) {
  return json::to_cbor(json{{"rank", r.rank},
                            {"stored", r.stored},
                            {"removed", r.removed},
                            {"host_stored", r.host_stored},
                            {"host_removed", r.host_removed},
                            {"disk_stored", r.disk_stored}});
}

WireCacheEvents decode_cache_events(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  using V = std::vector<uint64_t>;
  return WireCacheEvents{j.at("rank").get<int>(),  j.at("stored").get<V>(),       j.at("removed").get<V>(),
                         j.at("host_stored").get<V>(), j.at("host_removed").get<V>(), j.at("disk_stored").get<V>()};
}

std::vector<uint8_t> encode(const WirePrefill& r) {
  return json::to_cbor(json{{"request", request_json(r.request)},
                            {"dst", r.dst_blocks},
                            {"decode", r.decode_rank},
                            {"skip", r.skip_blocks}});
}

WirePrefill decode_prefill(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  return WirePrefill{request_from(j.at("request")), j.at("dst").get<std::vector<int32_t>>(), j.at("decode").get<int>(),
                     j.at("skip").get<int64_t>()};
}

std::vector<uint8_t> encode(const WireKvReady& r) {
  return json::to_cbor(json{{"id", r.id},
                            {"first", r.handoff.first_token},
                            {"logprobs", logprobs_json(r.handoff.logprobs)},
                            {"prompt_logprobs", logprobs_json(r.handoff.prompt_logprobs)},
                            {"computed", r.prompt_tokens_computed}});
}

WireKvReady decode_kv_ready(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  WireKvReady r;
  r.id = j.at("id");
  r.handoff.first_token = j.at("first");
  r.handoff.logprobs = logprobs_from(j.at("logprobs"));
  r.handoff.prompt_logprobs = logprobs_from(j.at("prompt_logprobs"));
  r.prompt_tokens_computed = j.at("computed");
  return r;
}

std::vector<uint8_t> encode(const WireResult& r) {
  return json::to_cbor(json{{"id", r.id},
                            {"ok", r.ok},
                            {"error", r.error},
                            {"tokens", r.tokens},
                            {"text", r.text},
                            {"finish", r.finish_reason},
                            {"logprobs", logprobs_json(r.logprobs)},
                            {"prompt_logprobs", logprobs_json(r.prompt_logprobs)},
                            {"ttft_s", r.ttft_s},
                            {"e2e_s", r.e2e_s},
                            {"computed", r.prompt_tokens_computed},
                            {"moved", r.kv_blocks_moved},
                            {"worker", r.worker},
                            // float32 little-endian bytes: exact and a quarter of CBOR doubles
                            {"embedding", json::binary(std::vector<uint8_t>(
                                              reinterpret_cast<const uint8_t*>(r.embedding.data()),
                                              reinterpret_cast<const uint8_t*>(r.embedding.data() + r.embedding.size())))}});
}

WireResult decode_result(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  WireResult r;
  r.id = j.at("id");
  r.ok = j.at("ok");
  r.error = j.at("error");
  r.tokens = j.at("tokens").get<std::vector<int32_t>>();
  r.text = j.at("text");
  r.finish_reason = j.at("finish");
  r.logprobs = logprobs_from(j.at("logprobs"));
  r.prompt_logprobs = logprobs_from(j.at("prompt_logprobs"));
  r.ttft_s = j.at("ttft_s");
  r.e2e_s = j.at("e2e_s");
  r.prompt_tokens_computed = j.at("computed");
  r.kv_blocks_moved = j.at("moved");
  r.worker = j.at("worker");
  const auto& vec = j.at("embedding").get_binary();
  r.embedding.resize(vec.size() / sizeof(float));
  std::memcpy(r.embedding.data(), vec.data(), r.embedding.size() * sizeof(float));
  return r;
}

std::vector<uint8_t> encode(const RankReport& r) {
  json kv_to = json::array();
  for (const auto& t : r.kv_sent_to) kv_to.push_back(json::array({t.rank, t.bytes, t.seconds}));
  return json::to_cbor(json{{"rank", r.rank}, {"role", static_cast<int>(r.role)}, {"tp", r.tp}, {"busy", r.busy_fraction},
                            {"prefill", r.prefill_tokens}, {"decode", r.decode_tokens},
                            {"hits", r.prefix_hit_tokens}, {"kv_bytes", r.kv_bytes_sent},
                            {"kv_s", r.kv_send_seconds}, {"kv_wait_s", r.kv_wait_seconds}, {"preempt", r.preemptions},
                            {"kv_used", r.kv_blocks_used}, {"kv_total", r.kv_blocks_total},
                            {"steps", steps_json(r.step_samples)}, {"tier_hits", r.hit_tokens_by_tier},
                            {"tiers", tiers_json(r.tiers)}, {"kv_to", kv_to}, {"experts", r.experts},
                            {"expert_tokens", r.expert_tokens}, {"expert_ranks", r.expert_ranks}});
}

RankReport decode_report(const std::vector<uint8_t>& bytes) {
  const json j = json::from_cbor(bytes);
  RankReport r;
  r.rank = j.at("rank");
  r.role = static_cast<Role>(j.at("role").get<int>());
  r.tp = j.at("tp");
  r.busy_fraction = j.at("busy");
  r.prefill_tokens = j.at("prefill");
  r.decode_tokens = j.at("decode");
  r.prefix_hit_tokens = j.at("hits");
  r.kv_bytes_sent = j.at("kv_bytes");
  r.kv_send_seconds = j.at("kv_s");
  r.kv_wait_seconds = j.at("kv_wait_s");
  r.preemptions = j.at("preempt");
  r.kv_blocks_used = j.at("kv_used");
  r.kv_blocks_total = j.at("kv_total");
  r.step_samples = steps_from_json(j.at("steps"));
  r.hit_tokens_by_tier = j.at("tier_hits").get<std::array<int64_t, 3>>();
  r.tiers = tiers_from_json(j.at("tiers"));
  for (const auto& t : j.at("kv_to")) r.kv_sent_to.push_back({t.at(0).get<int>(), t.at(1).get<int64_t>(), t.at(2).get<double>()});
  r.experts = j.at("experts");
  r.expert_tokens = j.at("expert_tokens").get<std::vector<int64_t>>();
  r.expert_ranks = j.at("expert_ranks");
  return r;
}

}  // namespace tandem::service
