// Tokenizer::from_gguf_vocab: rebuilds the pipeline transformers 5's GGUF
// converter (integrations/gguf/gguf_tokenizer_mapping.py) builds for the same
// metadata, so that ids match AutoTokenizer.from_pretrained(..., gguf_file=).
//   gpt2:  GPT2Tokenizer — byte-level BPE; ByteLevel(add_prefix_space=false)
//          with GPT-2's regex, unless tokenizer.ggml.pre names a known split
//          regex (llama-bpe, qwen2, ...), then Split(regex) + ByteLevel.
//          ("smollm" is not in that table: it gets the GPT-2 regex.)
//   llama: LlamaTokenizer — SentencePiece-style BPE with byte fallback,
//          Metaspace(prepend_scheme=first, split=false); merges from the file
//          or derived from scores as transformers' generate_merges does.
// Control tokens (type 3) become special added tokens, user-defined (4) plain
// added tokens; BOS/EOS/UNK/PAD spellings are special too.
#include <algorithm>
#include <map>
#include <unordered_set>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_state.h"
#include "tokenizer/unicode_text.h"

namespace osprey {

namespace {

constexpr std::string_view kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// tokenizer.ggml.pre -> split regex, as transformers' GGUF_PRE_TOKENIZER_SPLITS.
std::optional<std::string_view> split_for_pre(const std::string& pre) {
  static const std::map<std::string, std::string_view, std::less<>> kTable = {
      {"llama3", kLlama3Split},   {"llama-v3", kLlama3Split},  {"llama-bpe", kLlama3Split},
      {"falcon3", kLlama3Split},  {"falcon-h1", kLlama3Split}, {"pixtral", kLlama3Split},
      {"midm-2.0", kLlama3Split}, {"lfm2", kLlama3Split},      {"jina-v5-nano", kLlama3Split},
      {"dbrx", kLlama3Split},     {"smaug-bpe", kLlama3Split}, {"tekken", kTekkenSplit},
      {"qwen2", kQwen2Split},     {"deepseek-r1-qwen", kQwen2Split}, {"kormo", kQwen2Split},
      {"f2llmv2", kQwen2Split},   {"megrez", kQwen2Split},     {"qwen35", kQwen35Split},
      {"gpt-4o", kGpt4oSplit},    {"llama4", kGpt4oSplit},     {"kanana2", kGpt4oSplit},
      {"talkie", kGpt4oSplit},    {"minimax-m2", kGpt4oSplit},
  };
  if (auto it = kTable.find(pre); it != kTable.end()) return it->second;
  return std::nullopt;
}

bool in_byte_alphabet(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = tok::next_code_point(s, i);
    if (tok::unicode_to_byte(c) < 0 || (c == 0xFFFD && i - start != 3)) return false;
  }
  return true;
}

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

// transformers' generate_merges(vocab, scores): every split of every token
// into two vocabulary tokens, best score first (stable), ties by piece length.
std::vector<std::pair<std::string, std::string>> merges_from_scores(const std::vector<std::string>& tokens,
                                                                     const std::vector<float>& scores) {
  tok::TokenMap vocab;  // token -> last index
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int32_t>(i);
  // dict(zip(tokens, scores)): first position, last score.
  std::vector<size_t> order;
  std::unordered_map<std::string_view, float> score_of;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto [it, fresh] = score_of.emplace(tokens[i], scores[i]);
    if (fresh) order.push_back(i);
    else it->second = scores[i];
  }
  struct M {
    std::string l, r;
    float score;
    size_t len_l, len_r;
  };
  std::vector<M> merges;
  for (size_t i : order) {
    const std::string& t = tokens[i];
    std::vector<M> local;
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<uint8_t>(t[k]) & 0xC0) == 0x80) continue;  // split at code point boundaries only
      std::string_view l(t.data(), k), r(t.data() + k, t.size() - k);
      auto il = vocab.find(l), ir = vocab.find(r);
      if (il == vocab.end() || ir == vocab.end()) continue;
      local.push_back({std::string(l), std::string(r), score_of[t], code_points(l), code_points(r)});
    }
    std::stable_sort(local.begin(), local.end(), [&](const M& a, const M& b) {
      int32_t al = vocab.find(a.l)->second, bl = vocab.find(b.l)->second;
      if (al != bl) return al < bl;
      return vocab.find(a.r)->second < vocab.find(b.r)->second;
    });
    for (auto& m : local) merges.push_back(std::move(m));
  }
  // sorted(key=(score, len_l, len_r), reverse=True) is stable.
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (auto& m : merges) out.emplace_back(std::move(m.l), std::move(m.r));
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf_vocab(const GgufVocab& v) {
  const bool byte_level = v.model == "gpt2";
  if (!byte_level && v.model != "llama")
    return unsupported("GGUF tokenizer model '" + v.model + "' is not supported (gpt2 and llama are)");
  if (v.tokens.empty()) return invalid_argument("GGUF vocabulary has no tokens");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    return invalid_argument("GGUF token_type has " + std::to_string(v.token_types.size()) + " entries for " +
                            std::to_string(v.tokens.size()) + " tokens");
  if (!byte_level && v.merges.empty() && v.scores.size() != v.tokens.size())
    return invalid_argument("GGUF llama vocabulary has neither merges nor one score per token");
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  auto valid_id = [&](int32_t id) { return id >= 0 && id < n; };

  auto st = std::make_unique<tok::TokenizerState>();
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(v.tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    const std::string& t = v.tokens[i];
    if (!tok::is_valid_utf8(t)) return corrupt("GGUF token " + std::to_string(i) + " is not valid UTF-8");
    vocab.emplace_back(byte_level && !in_byte_alphabet(t) ? tok::bytes_to_byte_level(t) : t, i);
  }

  std::vector<std::pair<std::string, std::string>> merges;
  if (!v.merges.empty()) {
    merges.reserve(v.merges.size());
    for (const auto& m : v.merges) {
      size_t sp = m.find(' ');
      if (sp == std::string::npos) return invalid_argument("GGUF merge '" + m + "' has no space");
      merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  } else if (!byte_level) {
    merges = merges_from_scores(v.tokens, v.scores);
  }

  tok::BpeOptions opt;
  opt.byte_level = byte_level;
  opt.byte_fallback = !byte_level;
  opt.fuse_unk = !byte_level;
  OSP_ASSIGN_OR_RETURN(st->model, tok::BpeModel::create(vocab, merges, opt));

  st->id_to_token.resize(n);
  st->special.assign(n, 0);
  st->is_added.assign(n, 0);
  for (const auto& [t, id] : vocab) {
    st->id_to_token[id] = t;
    st->token_to_id[t] = id;  // later duplicates win, as in a Python dict
  }

  if (byte_level) {
    if (auto split = split_for_pre(v.pre)) {
      std::vector<std::unique_ptr<tok::PreTokenizer>> steps;
      OSP_ASSIGN_OR_RETURN(auto s, tok::PreTokenizer::make_split(*split, tok::SplitBehavior::kIsolated));
      steps.push_back(std::move(s));
      OSP_ASSIGN_OR_RETURN(auto b, tok::PreTokenizer::make_byte_level(false, false));
      steps.push_back(std::move(b));
      st->pre_tokenizer = tok::PreTokenizer::make_sequence(std::move(steps));
    } else {
      OSP_ASSIGN_OR_RETURN(st->pre_tokenizer, tok::PreTokenizer::make_byte_level(false, true));
    }
    st->decoder = tok::Decoder::make_byte_level();
  } else {
    st->pre_tokenizer = tok::PreTokenizer::make_metaspace("\xE2\x96\x81", tok::PreTokenizer::Prepend::kFirst, false);
    std::vector<std::unique_ptr<tok::Decoder>> steps;
    steps.push_back(tok::Decoder::make_replace("\xE2\x96\x81", " "));
    steps.push_back(tok::Decoder::make_simple(tok::Decoder::Kind::kByteFallback));
    steps.push_back(tok::Decoder::make_simple(tok::Decoder::Kind::kFuse));
    steps.push_back(tok::Decoder::make_strip(" ", 1, 0));
    st->decoder = tok::Decoder::make_sequence(std::move(steps));
  }

  // Added tokens: control, then user-defined, then the named special tokens.
  for (int32_t i = 0; i < n && !v.token_types.empty(); ++i) {
    if (v.token_types[i] == 3 && (!byte_level || in_byte_alphabet(v.tokens[i])))
      st->add_token({v.tokens[i], -1, true, false, false, false, false});
  }
  for (int32_t i = 0; i < n && !v.token_types.empty(); ++i) {
    if (v.token_types[i] == 4 && st->token_to_id.count(v.tokens[i]))
      st->add_token({v.tokens[i], -1, false, false, false, false, false});
  }
  for (int32_t id : {v.bos_id, v.eos_id, v.unk_id, v.pad_id}) {
    if (valid_id(id)) st->add_token({v.tokens[id], -1, true, false, false, false, false});
  }
  st->finalize();

  if (valid_id(v.bos_id)) st->bos_token = v.tokens[v.bos_id];
  if (valid_id(v.eos_id)) st->eos_token = v.tokens[v.eos_id];
  st->chat_template = v.chat_template;

  // transformers: add_bos_token defaults to true for SentencePiece files
  // without the flag, false otherwise; add_eos_token to false.
  const bool add_bos = v.add_bos.value_or(!byte_level);
  const bool add_eos = v.add_eos.value_or(false);
  auto id_of = [&](const std::string& t) -> std::optional<int32_t> {
    if (auto it = st->token_to_id.find(t); it != st->token_to_id.end()) return it->second;
    return std::nullopt;
  };
  if (add_bos && !st->bos_token.empty())
    if (auto id = id_of(st->bos_token)) st->post.before.push_back(*id);
  if (add_eos && !st->eos_token.empty())
    if (auto id = id_of(st->eos_token)) st->post.after.push_back(*id);

  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(st)));
}

}  // namespace osprey
