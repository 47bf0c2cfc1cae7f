#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "tokenizer/unicode_text.h"

namespace osprey::tok {

using nlohmann::json;

std::string utf8_lossy(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  return sanitize_utf8(bytes);
}

std::unique_ptr<Decoder> Decoder::make_byte_level() {
  auto d = std::make_unique<Decoder>();
  d->kind_ = Kind::kByteLevel;
  return d;
}
std::unique_ptr<Decoder> Decoder::make_replace(std::string from, std::string to) {
  auto d = std::make_unique<Decoder>();
  d->kind_ = Kind::kReplace;
  d->from_ = std::move(from);
  d->to_ = std::move(to);
  return d;
}
std::unique_ptr<Decoder> Decoder::make_simple(Kind kind) {
  auto d = std::make_unique<Decoder>();
  d->kind_ = kind;
  return d;
}
std::unique_ptr<Decoder> Decoder::make_strip(std::string content, size_t start, size_t stop) {
  auto d = std::make_unique<Decoder>();
  d->kind_ = Kind::kStrip;
  d->from_ = std::move(content);
  d->start_ = start;
  d->stop_ = stop;
  return d;
}
std::unique_ptr<Decoder> Decoder::make_sequence(std::vector<std::unique_ptr<Decoder>> steps) {
  auto d = std::make_unique<Decoder>();
  d->kind_ = Kind::kSequence;
  d->children_ = std::move(steps);
  return d;
}

Expected<std::unique_ptr<Decoder>> Decoder::from_json(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("decoder: object with a string \"type\" expected");
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return make_byte_level();
  if (type == "ByteFallback") return make_simple(Kind::kByteFallback);
  if (type == "Fuse") return make_simple(Kind::kFuse);
  if (type == "Replace") {
    if (!j.contains("pattern") || !j["pattern"].is_object() || !j["pattern"].contains("String") ||
        !j["pattern"]["String"].is_string() || !j.contains("content") || !j["content"].is_string())
      return unsupported("decoder Replace: only {\"String\": ...} patterns with a string content are supported");
    return make_replace(j["pattern"]["String"].get<std::string>(), j["content"].get<std::string>());
  }
  if (type == "Strip") {
    if (!j.contains("content") || !j["content"].is_string())
      return invalid_argument("decoder Strip: string \"content\" expected");
    auto start = j.value("start", 0), stop = j.value("stop", 0);
    if (start < 0 || stop < 0) return invalid_argument("decoder Strip: negative start/stop");
    return make_strip(j["content"].get<std::string>(), static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<Decoder>();
    d->kind_ = Kind::kMetaspace;
    d->replacement_ = j.value("replacement", std::string("\xE2\x96\x81"));
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      d->prepend_ = j["prepend_scheme"].get<std::string>() != "never";
    else
      d->prepend_ = j.value("add_prefix_space", true);
    return d;
  }
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array())
      return invalid_argument("decoder Sequence: array \"decoders\" expected");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& c : j["decoders"]) {
      OSP_ASSIGN_OR_RETURN(auto child, from_json(c));
      steps.push_back(std::move(child));
    }
    return make_sequence(std::move(steps));
  }
  return unsupported("decoder type '" + type + "' is not supported");
}

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

}  // namespace

void Decoder::decode_chain(std::vector<std::string>& tokens) const {
  switch (kind_) {
    case Kind::kByteLevel: {
      std::string bytes, tmp;
      for (const auto& t : tokens) {
        if (byte_level_to_bytes(t, tmp)) bytes += tmp;
        else bytes += t;
      }
      tokens.assign(1, utf8_lossy(bytes));
      return;
    }
    case Kind::kReplace:
      for (auto& t : tokens) replace_all(t, from_, to_);
      return;
    case Kind::kByteFallback: {
      std::vector<std::string> out;
      out.reserve(tokens.size());
      std::string pending;
      size_t pending_count = 0;
      auto flush = [&]() {
        if (pending_count == 0) return;
        if (is_valid_utf8(pending)) {
          out.push_back(pending);
        } else {
          for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
        }
        pending.clear();
        pending_count = 0;
      };
      for (auto& t : tokens) {
        int b = parse_byte_token(t);
        if (b >= 0) {
          pending.push_back(static_cast<char>(b));
          ++pending_count;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens.swap(out);
      return;
    }
    case Kind::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case Kind::kStrip: {
      // Strips up to start_ leading and stop_ trailing occurrences of the
      // content character from each token.
      const std::string& c = from_;
      for (auto& t : tokens) {
        size_t a = 0, n = 0;
        while (n < start_ && !c.empty() && t.compare(a, c.size(), c) == 0) {
          a += c.size();
          ++n;
        }
        size_t b = t.size();
        n = 0;
        while (n < stop_ && !c.empty() && b >= a + c.size() && t.compare(b - c.size(), c.size(), c) == 0) {
          b -= c.size();
          ++n;
        }
        t = t.substr(a, b - a);
      }
      return;
    }
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        replace_all(tokens[i], replacement_, " ");
        if (i == 0 && prepend_ && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
      }
      return;
    case Kind::kSequence:
      for (const auto& c : children_) c->decode_chain(tokens);
      return;
  }
}

}  // namespace osprey::tok
