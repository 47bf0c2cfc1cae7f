#include "tokenizer/chat_template.h"

#include <new>

#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace osprey {
namespace {

Status to_status(const jinja::TemplateError& e, const char* what) {
  std::string msg = std::string(what);
  if (e.line > 0) msg += " (line " + std::to_string(e.line) + ", column " + std::to_string(e.column) + ")";
  msg += ": " + e.message;
  return Status(e.code, std::move(msg));
}

template <class Json>
Expected<std::string> render_impl(const jinja::Template& t, const Json& context, const TemplateLimits& limits) {
  if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
  try {
    jinja::Interpreter in(limits);
    for (auto it = context.begin(); it != context.end(); ++it) in.set_global(it.key(), jinja::Value::from_json(it.value()));
    return in.render(t);
  } catch (const jinja::TemplateError& e) {
    return to_status(e, "chat template render error");
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template render ran out of memory");
  } catch (const std::exception& e) {
    return internal_error(std::string("chat template render failed: ") + e.what());
  }
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::compile(std::string_view source) {
  try {
    return ChatTemplate(std::shared_ptr<const jinja::Template>(jinja::parse_template(source)));
  } catch (const jinja::TemplateError& e) {
    return to_status(e, "chat template syntax error");
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template too large to compile");
  } catch (const std::exception& e) {
    return internal_error(std::string("chat template compile failed: ") + e.what());
  }
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& context, const TemplateLimits& limits) const {
  return render_impl(*tmpl_, context, limits);
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& context, const TemplateLimits& limits) const {
  return render_impl(*tmpl_, context, limits);
}

const std::string& ChatTemplate::source() const { return tmpl_->source; }

}  // namespace osprey
