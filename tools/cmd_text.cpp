// osprey tokenize / detokenize / template: the tokenizer and chat template
// from the command line, for tests and for debugging prompts.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "osprey/text.h"

namespace osprey::cli {

namespace {

std::unique_ptr<TextProcessor> open_or_report(const std::string& path) {
  auto tp = TextProcessor::open(path);
  if (!tp.ok()) {
    std::fprintf(stderr, "osprey: %s\n", tp.status().to_string().c_str());
    exit_code() = 1;
    return nullptr;
  }
  return std::move(tp).value();
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

bool parse_json_file(const std::string& path, nlohmann::ordered_json& out) {
  std::string text;
  if (!read_file(path, text)) {
    std::fprintf(stderr, "osprey: cannot read %s\n", path.c_str());
    return false;
  }
  out = nlohmann::ordered_json::parse(text, nullptr, false);
  if (out.is_discarded()) {
    std::fprintf(stderr, "osprey: %s is not valid JSON\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

void add_text_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
    auto tok = std::make_shared<std::string>("default");
    auto text = std::make_shared<std::string>();
    auto no_special = std::make_shared<bool>(false);
    cmd->add_option("--tokenizer", *tok, "Model folder, tokenizer.json or .gguf ('default' = default model)");
    cmd->add_option("--text", *text, "Text to encode (default: standard input)");
    cmd->add_flag("--no-special", *no_special, "Do not add special tokens (BOS/EOS)");
    cmd->callback([=] {
      auto tp = open_or_report(*tok);
      if (!tp) return;
      std::string input = *text;
      if (input.empty()) input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      std::printf("%s\n", nlohmann::json(tp->encode(input, !*no_special)).dump().c_str());
    });
  }
  {
    auto* cmd = app.add_subcommand("detokenize", "Print the text of a JSON array of token ids");
    auto tok = std::make_shared<std::string>("default");
    auto ids = std::make_shared<std::string>();
    auto skip = std::make_shared<bool>(false);
    cmd->add_option("--tokenizer", *tok, "Model folder, tokenizer.json or .gguf");
    cmd->add_option("--ids", *ids, "Token ids as a JSON array")->required();
    cmd->add_flag("--skip-special", *skip, "Leave out special tokens");
    cmd->callback([=] {
      auto parsed = nlohmann::json::parse(*ids, nullptr, false);
      std::vector<int32_t> v;
      if (parsed.is_discarded() || !parsed.is_array()) {
        std::fprintf(stderr, "osprey: --ids must be a JSON array of integers\n");
        exit_code() = 2;
        return;
      }
      for (const auto& x : parsed) {
        if (!x.is_number_integer()) {
          std::fprintf(stderr, "osprey: --ids must be a JSON array of integers\n");
          exit_code() = 2;
          return;
        }
        v.push_back(x.get<int32_t>());
      }
      auto tp = open_or_report(*tok);
      if (!tp) return;
      std::string out = tp->decode(v, *skip);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::printf("\n");
    });
  }
  {
    auto* cmd = app.add_subcommand("template", "Render chat messages with the model's chat template");
    auto tok = std::make_shared<std::string>("default");
    auto messages = std::make_shared<std::string>();
    auto tools = std::make_shared<std::string>();
    auto gen = std::make_shared<bool>(false);
    auto vars = std::make_shared<std::vector<std::string>>();
    cmd->add_option("--tokenizer", *tok, "Model folder, tokenizer.json or .gguf");
    cmd->add_option("--messages", *messages, "JSON file with the messages array")->required();
    cmd->add_option("--tools", *tools, "JSON file with the tools array");
    cmd->add_flag("--add-generation-prompt", *gen, "End with the assistant's turn opening");
    cmd->add_option("--var", *vars, "Extra template variable NAME=JSON (repeatable)");
    cmd->callback([=] {
      nlohmann::ordered_json msgs, tls, extra = nlohmann::ordered_json::object();
      if (!parse_json_file(*messages, msgs)) {
        exit_code() = 2;
        return;
      }
      if (!tools->empty() && !parse_json_file(*tools, tls)) {
        exit_code() = 2;
        return;
      }
      for (const std::string& kv : *vars) {
        const size_t eq = kv.find('=');
        auto value = eq == std::string::npos ? nlohmann::ordered_json()
                                            : nlohmann::ordered_json::parse(kv.substr(eq + 1), nullptr, false);
        if (eq == std::string::npos || value.is_discarded()) {
          std::fprintf(stderr, "osprey: --var expects NAME=JSON, got '%s'\n", kv.c_str());
          exit_code() = 2;
          return;
        }
        extra[kv.substr(0, eq)] = value;
      }
      auto tp = open_or_report(*tok);
      if (!tp) return;
      auto out = tp->apply_chat_template(msgs, tls, *gen, extra);
      if (!out.ok()) {
        std::fprintf(stderr, "osprey: %s\n", out.status().to_string().c_str());
        exit_code() = 1;
        return;
      }
      std::fwrite(out->data(), 1, out->size(), stdout);
    });
  }
}

}  // namespace osprey::cli
