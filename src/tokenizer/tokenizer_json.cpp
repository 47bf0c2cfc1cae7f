// Tokenizer::from_json / from_path: tokenizer.json (+ tokenizer_config.json)
// as transformers 5's AutoTokenizer assembles them:
//  - tokenizer_class LlamaTokenizer(Fast), Qwen2Tokenizer(Fast) and
//    GPT2Tokenizer(Fast) rebuild normalizer, pre-tokenizer and decoder from
//    the class (only vocab, merges, added tokens and post-processor come from
//    tokenizer.json); other classes use tokenizer.json as is.
//  - when the config states add_bos_token/add_eos_token, or tokenizer.json
//    has no post-processor, the post-processor becomes BOS? $A EOS?.
//  - bos/eos/unk/pad and additional special tokens named in the config are
//    special added tokens.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_state.h"
#include "tokenizer/unicode_text.h"

namespace osprey {

using nlohmann::json;

namespace {

constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kMetaspaceChar = "\xE2\x96\x81";

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

std::optional<bool> config_bool(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key) || !cfg[key].is_boolean()) return std::nullopt;
  return cfg[key].get<bool>();
}

Status parse_post_processor(const json& j, const tok::TokenizerState& st, tok::PostTemplate& post) {
  const std::string type = j.value("type", std::string());
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      return invalid_argument("post_processor Sequence: array \"processors\" expected");
    for (const auto& p : j["processors"]) OSP_RETURN_IF_ERROR(parse_post_processor(p, st, post));
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key, int32_t& id) -> bool {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer()) return false;
      id = j[key][1].get<int32_t>();
      return true;
    };
    int32_t cls = 0, sep = 0;
    if (!id_of("cls", cls) || !id_of("sep", sep))
      return invalid_argument("post_processor " + type + ": \"cls\" and \"sep\" [token, id] expected");
    post.before = {cls};
    post.after = {sep};
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array())
      return invalid_argument("post_processor TemplateProcessing: array \"single\" expected");
    const json specials = j.value("special_tokens", json::object());
    post.before.clear();
    post.after.clear();
    bool seen_a = false;
    for (const auto& piece : j["single"]) {
      if (piece.contains("Sequence")) {
        if (seen_a) return unsupported("post_processor TemplateProcessing: $A appears twice in \"single\"");
        seen_a = true;
        continue;
      }
      if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id"))
        return invalid_argument("post_processor TemplateProcessing: unknown template piece");
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        return invalid_argument("post_processor TemplateProcessing: special token '" + name + "' has no ids");
      auto& dst = seen_a ? post.after : post.before;
      for (const auto& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return invalid_argument("post_processor TemplateProcessing: non-integer id");
        dst.push_back(id.get<int32_t>());
      }
    }
    return Status::Ok();
  }
  return unsupported("post_processor type '" + type + "' is not supported");
}

Expected<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return not_found("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path json_path = path, cfg_path;
  if (fs::is_directory(path, ec)) {
    json_path = fs::path(path) / "tokenizer.json";
    cfg_path = fs::path(path) / "tokenizer_config.json";
  } else {
    cfg_path = json_path.parent_path() / "tokenizer_config.json";
  }
  OSP_ASSIGN_OR_RETURN(std::string tj, read_file(json_path));
  std::string cfg;
  if (fs::exists(cfg_path, ec)) {
    OSP_ASSIGN_OR_RETURN(std::string c, read_file(cfg_path));
    cfg = std::move(c);
  }
  auto t = from_json(tj, cfg);
  if (!t.ok()) return Status(t.status().code(), json_path.string() + ": " + t.status().message());
  return t;
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                          std::string_view tokenizer_config_json) {
  json j = json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tokenizer.json is not a JSON object");
  json cfg = json::object();
  if (!tokenizer_config_json.empty()) {
    cfg = json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument("tokenizer_config.json is not a JSON object");
  }
  try {
    if (!j.contains("model") || !j["model"].is_object()) return invalid_argument("tokenizer.json has no \"model\"");
    const json& m = j["model"];
    const std::string mtype = m.value("type", m.contains("merges") ? std::string("BPE") : std::string());
    if (mtype != "BPE") return unsupported("model type '" + mtype + "' is not supported (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      return unsupported("model BPE: dropout is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
        return unsupported(std::string("model BPE: ") + k + " is not supported");
    }
    if (!m.contains("vocab") || !m["vocab"].is_object()) return invalid_argument("model BPE: object \"vocab\" expected");
    std::vector<std::pair<std::string, int32_t>> vocab;
    vocab.reserve(m["vocab"].size());
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1 << 30))
        return invalid_argument("model BPE: vocab id of '" + it.key() + "' is not a valid id");
      vocab.emplace_back(it.key(), it.value().get<int32_t>());
    }
    std::vector<std::pair<std::string, std::string>> merges;
    if (m.contains("merges")) {
      if (!m["merges"].is_array()) return invalid_argument("model BPE: array \"merges\" expected");
      merges.reserve(m["merges"].size());
      for (const auto& mg : m["merges"]) {
        if (mg.is_string()) {
          const std::string s = mg.get<std::string>();
          size_t sp = s.find(' ');
          if (sp == std::string::npos) return invalid_argument("model BPE: merge '" + s + "' has no space");
          merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
          merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
        } else {
          return invalid_argument("model BPE: a merge is neither \"a b\" nor [a, b]");
        }
      }
    }

    auto st = std::make_unique<tok::TokenizerState>();
    tok::BpeOptions opt;
    opt.byte_fallback = m.value("byte_fallback", false);
    opt.fuse_unk = m.value("fuse_unk", false);
    opt.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) opt.unk_token = m["unk_token"].get<std::string>();

    // Pipeline stages: from the class transformers would build, or the file.
    const std::string cls = cfg.value("tokenizer_class", std::string());
    const json null_json;
    auto stage = [&](const char* key) -> const json& { return j.contains(key) ? j[key] : null_json; };
    if (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") {
      const bool add_prefix_space = config_bool(cfg, "add_prefix_space").value_or(true);
      const bool legacy = config_bool(cfg, "legacy").value_or(false);
      opt = tok::BpeOptions{};
      opt.byte_fallback = true;
      opt.fuse_unk = true;
      auto scheme = !add_prefix_space ? tok::PreTokenizer::Prepend::kNever
                    : legacy          ? tok::PreTokenizer::Prepend::kAlways
                                      : tok::PreTokenizer::Prepend::kFirst;
      st->pre_tokenizer = tok::PreTokenizer::make_metaspace(kMetaspaceChar, scheme, false);
      std::vector<std::unique_ptr<tok::Decoder>> steps;
      steps.push_back(tok::Decoder::make_replace(kMetaspaceChar, " "));
      steps.push_back(tok::Decoder::make_simple(tok::Decoder::Kind::kByteFallback));
      steps.push_back(tok::Decoder::make_simple(tok::Decoder::Kind::kFuse));
      if (add_prefix_space) steps.push_back(tok::Decoder::make_strip(" ", 1, 0));
      st->decoder = tok::Decoder::make_sequence(std::move(steps));
    } else if (cls == "Qwen2Tokenizer" || cls == "Qwen2TokenizerFast") {
      opt = tok::BpeOptions{};
      st->normalizer = tok::Normalizer::make_nfc();
      std::vector<std::unique_ptr<tok::PreTokenizer>> steps;
      OSP_ASSIGN_OR_RETURN(auto split, tok::PreTokenizer::make_split(kQwen2Pattern, tok::SplitBehavior::kIsolated));
      steps.push_back(std::move(split));
      OSP_ASSIGN_OR_RETURN(auto bl, tok::PreTokenizer::make_byte_level(config_bool(cfg, "add_prefix_space").value_or(false), false));
      steps.push_back(std::move(bl));
      st->pre_tokenizer = tok::PreTokenizer::make_sequence(std::move(steps));
      st->decoder = tok::Decoder::make_byte_level();
    } else if (cls == "GPT2Tokenizer" || cls == "GPT2TokenizerFast") {
      opt = tok::BpeOptions{};
      OSP_ASSIGN_OR_RETURN(st->pre_tokenizer,
                           tok::PreTokenizer::make_byte_level(config_bool(cfg, "add_prefix_space").value_or(false), true));
      st->decoder = tok::Decoder::make_byte_level();
    } else {
      if (!stage("normalizer").is_null()) { OSP_ASSIGN_OR_RETURN(st->normalizer, tok::Normalizer::from_json(stage("normalizer"))); }
      if (!stage("pre_tokenizer").is_null()) {
        OSP_ASSIGN_OR_RETURN(st->pre_tokenizer, tok::PreTokenizer::from_json(stage("pre_tokenizer")));
      }
      if (!stage("decoder").is_null()) { OSP_ASSIGN_OR_RETURN(st->decoder, tok::Decoder::from_json(stage("decoder"))); }
    }
    if (st->pre_tokenizer && st->pre_tokenizer->contains_byte_level()) {
      if (!st->pre_tokenizer->ends_with_byte_level())
        return unsupported("pre_tokenizer: ByteLevel is supported only as the last step");
      opt.byte_level = true;
    }
    OSP_ASSIGN_OR_RETURN(st->model, tok::BpeModel::create(vocab, merges, opt));

    int32_t max_id = -1;
    for (const auto& [t, id] : vocab) max_id = std::max(max_id, id);
    st->id_to_token.resize(static_cast<size_t>(max_id + 1));
    for (const auto& [t, id] : vocab) {
      st->id_to_token[id] = t;
      st->token_to_id[t] = id;
    }
    st->special.assign(st->id_to_token.size(), 0);
    st->is_added.assign(st->id_to_token.size(), 0);

    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) return invalid_argument("\"added_tokens\" must be an array");
      for (const auto& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
            !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (1 << 30))
          return invalid_argument("added_tokens: each entry needs a string \"content\" and a valid \"id\"");
        tok::AddedToken t;
        t.content = a["content"].get<std::string>();
        t.id = a["id"].get<int32_t>();
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.single_word = a.value("single_word", false);
        t.normalized = a.value("normalized", !t.special);
        st->add_token(std::move(t));
      }
    }
    // Special tokens named in the config (transformers' _post_init).
    std::vector<std::string> named;
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (auto t = config_token(cfg, k)) named.push_back(*t);
    for (const char* k : {"additional_special_tokens", "extra_special_tokens"}) {
      if (cfg.contains(k) && cfg[k].is_array())
        for (const auto& v : cfg[k]) {
          if (v.is_string()) named.push_back(v.get<std::string>());
          else if (v.is_object() && v.contains("content") && v["content"].is_string())
            named.push_back(v["content"].get<std::string>());
        }
    }
    for (auto& t : named) st->add_token({t, -1, true, false, false, false, false});
    st->finalize();

    st->bos_token = config_token(cfg, "bos_token").value_or("");
    st->eos_token = config_token(cfg, "eos_token").value_or("");
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        st->chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& e : ct) {
          if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
              e["template"].is_string())
            st->chat_template = e["template"].get<std::string>();
        }
      }
    }

    const json& pp = stage("post_processor");
    const bool explicit_flags = cfg.contains("add_bos_token") || cfg.contains("add_eos_token");
    if (explicit_flags || pp.is_null()) {
      const bool add_bos = config_bool(cfg, "add_bos_token").value_or(false);
      const bool add_eos = config_bool(cfg, "add_eos_token").value_or(false);
      auto id_of = [&](const std::string& t) -> std::optional<int32_t> {
        if (auto it = st->token_to_id.find(t); it != st->token_to_id.end()) return it->second;
        return std::nullopt;
      };
      if (add_bos && !st->bos_token.empty())
        if (auto id = id_of(st->bos_token)) st->post.before.push_back(*id);
      if (add_eos && !st->eos_token.empty())
        if (auto id = id_of(st->eos_token)) st->post.after.push_back(*id);
    } else {
      OSP_RETURN_IF_ERROR(parse_post_processor(pp, *st, st->post));
    }
    for (int32_t id : st->post.before)
      if (id < 0 || id >= static_cast<int32_t>(st->id_to_token.size()))
        return invalid_argument("post_processor: special token id " + std::to_string(id) + " is out of range");
    for (int32_t id : st->post.after)
      if (id < 0 || id >= static_cast<int32_t>(st->id_to_token.size()))
        return invalid_argument("post_processor: special token id " + std::to_string(id) + " is out of range");
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(st)));
  } catch (const json::exception& e) {
    return invalid_argument(std::string("tokenizer.json: ") + e.what());
  }
}

}  // namespace osprey
