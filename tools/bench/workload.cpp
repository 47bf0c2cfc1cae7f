#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "osprey/text.h"

namespace osprey::bench {

namespace {

// Common English words; those that are one token after a space in the model's
// vocabulary become the prompt alphabet.
constexpr const char* kWords[] = {
    "the",    "of",     "and",   "to",     "in",     "is",     "that",   "for",    "it",     "as",     "was",
    "with",   "be",     "by",    "on",     "not",    "he",     "this",   "are",    "or",     "his",    "from",
    "at",     "which",  "but",   "have",   "an",     "had",    "they",   "you",    "were",   "their",  "one",
    "all",    "we",     "can",   "her",    "has",    "there",  "been",   "if",     "more",   "when",   "will",
    "would",  "who",    "so",    "no",     "time",   "out",    "up",     "about",  "into",   "them",   "some",
    "could",  "him",    "what",  "only",   "its",    "then",   "other",  "than",   "first",  "new",    "also",
    "may",    "over",   "such",  "after",  "these",  "two",    "most",   "any",    "people", "made",   "like",
    "many",   "should", "very",  "where",  "years",  "well",   "work",   "how",    "even",   "back",   "good",
    "water",  "through", "long", "great",  "before", "same",   "world",  "day",    "house",  "life",   "small",
    "place",  "found",  "while", "last",   "right",  "city",   "down",   "still",  "must",   "game",   "part",
    "school", "under",  "home",  "book",   "light",  "music",  "story",  "never",  "open",   "river",  "green",
    "state",  "night",  "road",  "field",  "power",  "family", "money",  "table",  "stone",  "young",  "early",
    "paper",  "horse", "color",  "north",  "south",  "simple", "summer", "winter", "garden", "window",
};

// Tokens the tokenizer adds around a text (BOS, EOS); some add none to an empty text.
int special_count(const TextProcessor& t, bool count_special) {
  if (!count_special) return 0;
  return static_cast<int>(t.encode("the", true).size()) - static_cast<int>(t.encode("the", false).size());
}

}  // namespace

Expected<std::unique_ptr<PromptBuilder>> PromptBuilder::create(std::shared_ptr<const TextProcessor> text,
                                                               bool count_special_tokens) {
  std::unique_ptr<PromptBuilder> b(new PromptBuilder());
  b->count_special_ = count_special_tokens;
  if (!text) return b;
  b->text_ = std::move(text);
  b->num_special_ = special_count(*b->text_, count_special_tokens);
  for (const char* w : kWords) {
    const std::string spaced = std::string(" ") + w;
    if (b->text_->encode(spaced, false).size() != 1) continue;
    if (std::find(b->words_.begin(), b->words_.end(), spaced) != b->words_.end()) continue;
    b->words_.push_back(spaced);
  }
  if (b->words_.size() < 16)
    return unsupported("the tokenizer has too few single-token English words to build exact-length prompts");
  return b;
}

int PromptBuilder::count_tokens(const std::string& text) const {
  if (!text_) return static_cast<int>((text.size() + 3) / 4);  // a rough guess without a tokenizer
  return static_cast<int>(text_->encode(text, count_special_).size());
}

std::string PromptBuilder::join(const std::vector<int>& words, bool leading_space) const {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words_[static_cast<size_t>(words[i])];
    s += (i == 0 && !leading_space) ? w.substr(1) : w;
  }
  return s;
}

std::string PromptBuilder::make_text(std::mt19937_64& rng, int num_tokens, const std::string& prefix,
                                     int* actual) const {
  if (!text_ || num_tokens <= 0) {
    if (actual) *actual = 0;
    return {};
  }
  std::uniform_int_distribution<int> pick(0, static_cast<int>(words_.size()) - 1);
  const bool has_prefix = !prefix.empty();
  // Without a prefix the count includes the special tokens (when counted at all).
  const int base = has_prefix ? count_tokens(prefix) : 0;
  std::vector<int> words(static_cast<size_t>(std::max(1, num_tokens - (has_prefix ? 0 : num_special_))));
  for (auto& w : words) w = pick(rng);
  // Each word is about one token; correct the count a few times where the
  // tokenizer merges across word boundaries or adds a prefix space.
  int got = 0;
  std::string text;
  for (int iter = 0; iter < 16; ++iter) {
    text = join(words, has_prefix);
    got = count_tokens(prefix + text) - base;
    if (got == num_tokens) break;
    if (got > num_tokens) {
      const size_t drop = std::min(static_cast<size_t>(got - num_tokens), words.size() - 1);
      if (drop == 0) break;
      words.resize(words.size() - drop);
    } else {
      for (int k = 0; k < num_tokens - got; ++k) words.push_back(pick(rng));
    }
  }
  if (actual) *actual = got;
  return text;
}

int draw_length(std::mt19937_64& rng, const std::string& dist, int mean, double range_ratio, double stddev) {
  double v = mean;
  if (dist == "normal") {
    if (stddev > 0) v = std::normal_distribution<double>(mean, stddev)(rng);
  } else if (dist == "lognormal") {
    if (stddev > 0 && mean > 0) {
      // The lognormal whose mean and standard deviation are `mean` and `stddev`.
      const double s2 = std::log1p((stddev * stddev) / (static_cast<double>(mean) * mean));
      const double mu = std::log(static_cast<double>(mean)) - s2 / 2;
      v = std::lognormal_distribution<double>(mu, std::sqrt(s2))(rng);
    }
  } else if (range_ratio > 0) {  // uniform
    const int lo = std::max(1, static_cast<int>(std::lround(mean * (1 - range_ratio))));
    const int hi = std::max(lo, static_cast<int>(std::lround(mean * (1 + range_ratio))));
    v = std::uniform_int_distribution<int>(lo, hi)(rng);
  }
  return std::max(1, static_cast<int>(std::lround(v)));
}

namespace {

Expected<std::vector<Conversation>> make_sharegpt(const WorkloadOptions& o, const PromptBuilder& builder,
                                                  std::mt19937_64& rng) {
  std::ifstream f(o.dataset_path, std::ios::binary);
  if (!f) return not_found("cannot open dataset " + o.dataset_path);
  nlohmann::json data = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (data.is_discarded() || !data.is_array())
    return invalid_argument(o.dataset_path + ": not a JSON array of ShareGPT conversations");
  // (prompt, answer) pairs: the first human turn and the gpt turn after it.
  std::vector<std::pair<const std::string*, const std::string*>> pairs;
  for (const auto& e : data) {
    if (!e.is_object()) continue;
    auto c = e.find("conversations");
    if (c == e.end() || !c->is_array() || c->size() < 2) continue;
    const auto& h = (*c)[0];
    const auto& g = (*c)[1];
    if (!h.is_object() || !g.is_object()) continue;
    auto hv = h.find("value");
    auto gv = g.find("value");
    if (hv == h.end() || gv == g.end() || !hv->is_string() || !gv->is_string()) continue;
    if (h.value("from", "") != "human" || g.value("from", "") != "gpt") continue;
    pairs.emplace_back(&hv->get_ref<const std::string&>(), &gv->get_ref<const std::string&>());
  }
  std::vector<size_t> order(pairs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Conversation> out;
  for (size_t i : order) {
    if (static_cast<int>(out.size()) >= o.num_prompts) break;
    Turn t;
    t.text = *pairs[i].first;
    t.input_tokens = builder.count_tokens(t.text);
    t.output_tokens = o.sharegpt_output_len > 0 ? o.sharegpt_output_len : builder.count_tokens(*pairs[i].second);
    // vLLM's filter: very short prompts/answers, and long ones, are left out.
    if (t.input_tokens < 4 || (o.sharegpt_output_len <= 0 && t.output_tokens < 4)) continue;
    if (t.input_tokens > o.max_prompt_len || t.input_tokens + t.output_tokens > o.max_total_len) continue;
    Conversation c;
    c.turns.push_back(std::move(t));
    out.push_back(std::move(c));
  }
  if (out.empty()) return invalid_argument(o.dataset_path + ": no usable conversations");
  if (static_cast<int>(out.size()) < o.num_prompts) {
    // Fewer usable pairs than prompts asked: reuse them in order.
    const size_t n = out.size();
    for (size_t i = 0; static_cast<int>(out.size()) < o.num_prompts; ++i) out.push_back(out[i % n]);
  }
  return out;
}

}  // namespace

Expected<std::vector<Conversation>> make_workload(const WorkloadOptions& o, const PromptBuilder& builder) {
  if (o.num_prompts < 0) return invalid_argument("--num-prompts must be >= 0");
  if (o.dist != "uniform" && o.dist != "normal" && o.dist != "lognormal")
    return invalid_argument("--dist must be uniform, normal or lognormal");
  std::mt19937_64 rng(o.seed);
  if (o.dataset == "sharegpt") {
    if (o.dataset_path.empty()) return invalid_argument("--dataset-name sharegpt needs --dataset-path");
    return make_sharegpt(o, builder, rng);
  }
  const bool multi = o.dataset == "multi-turn";
  const bool prefix = o.dataset == "prefix";
  if (o.dataset != "random" && !multi && !prefix)
    return invalid_argument("unknown dataset '" + o.dataset + "' (random, sharegpt, prefix, multi-turn)");
  if (!builder.has_tokenizer() && o.dataset != "random")
    return invalid_argument("the " + o.dataset + " workload needs a tokenizer (--tokenizer)");
  if (o.min_token_id < 0 || o.max_token_id <= o.min_token_id) return invalid_argument("bad token id range");

  std::vector<std::string> systems;
  std::vector<int> system_tokens;
  if (prefix) {
    if (o.num_prefix_groups < 1) return invalid_argument("--num-prefix-groups must be >= 1");
    for (int g = 0; g < o.num_prefix_groups; ++g) {
      int got = 0;
      systems.push_back(builder.make_text(rng, o.prefix_len, "", &got));
      system_tokens.push_back(got);
    }
  }
  std::uniform_int_distribution<int32_t> id_dist(o.min_token_id, o.max_token_id - 1);
  std::vector<Conversation> out;
  out.reserve(static_cast<size_t>(o.num_prompts));
  for (int i = 0; i < o.num_prompts; ++i) {
    Conversation c;
    if (prefix) {
      c.group = i % o.num_prefix_groups;
      c.system = systems[static_cast<size_t>(c.group)];
      c.system_tokens = system_tokens[static_cast<size_t>(c.group)];
    }
    const int turns = multi ? std::max(1, o.num_turns) : 1;
    for (int k = 0; k < turns; ++k) {
      Turn t;
      const int in = draw_length(rng, o.dist, o.input_len, o.range_ratio, o.input_std);
      t.output_tokens = draw_length(rng, o.dist, o.output_len, o.range_ratio, o.output_std);
      if (!builder.has_tokenizer()) {
        t.token_ids.resize(static_cast<size_t>(in));
        for (auto& x : t.token_ids) x = id_dist(rng);
        t.input_tokens = in;
      } else {
        int got = 0;
        t.text = builder.make_text(rng, in, c.system, &got);
        t.input_tokens = got;
      }
      c.turns.push_back(std::move(t));
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace osprey::bench
