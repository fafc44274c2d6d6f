#include "text/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "text/bpe.h"
#include "text/sentencepiece.h"

namespace meshlm::text {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (uint32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Tokenizer::why_no_token(uint32_t id) const {
  if (has_token(id)) return "";
  if (id >= vocab_size())
    return fmt::format("is not in the tokenizer's vocabulary (size {})", vocab_size());
  return fmt::format("has no token: the tokenizer leaves it unassigned (its ids below its "
                     "vocabulary size {} have gaps)",
                     vocab_size());
}

std::optional<uint32_t> Tokenizer::eot_id() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (auto id = token_id(name)) return id;
  return std::nullopt;
}

namespace {

class ByteTokenizer final : public Tokenizer {
public:
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string token_bytes(uint32_t id) const override {
    if (id >= 256)
      throw RankError(fmt::format("token id {} is not a byte (the byte tokenizer's vocabulary "
                                  "is 256)",
                                  id),
                      MESHLM_HERE);
    return std::string(1, static_cast<char>(id));
  }
  uint64_t vocab_size() const override { return 256; }
  std::optional<uint32_t> token_id(std::string_view content) const override {
    if (content.size() == 1) return static_cast<unsigned char>(content[0]);
    return std::nullopt;
  }
  std::optional<uint32_t> bos_id() const override { return std::nullopt; }
  std::string kind() const override { return "byte"; }
};

std::string read_text_file(const std::string& path) {
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) throw RankError("tokenizer '" + path + "' is " + kind, MESHLM_HERE);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RankError("cannot read tokenizer file '" + path + "'", MESHLM_HERE);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw RankError(fmt::format("{}: not valid JSON: {}", path, e.what()), MESHLM_HERE);
  }
}

// Where a value sits in a tokenizer.json, for messages: the file and the
// key's path from the root ("pre_tokenizer.pretokenizers[1].use_regex").
struct At {
  std::string file, path;
  At operator/(std::string_view key) const {
    return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  At operator[](size_t i) const { return {file, fmt::format("{}[{}]", path, i)}; }
};

// `v`, the value at `at`, when it is of JSON type `type` (number_unsigned:
// any integer, whose sign its reader checks; number_float: any number);
// else an error naming the file, the key's path, its type and the one
// meshlm reads there. Every read of tokenizer.json goes through here.
const json& typed(const json& v, const At& at, json::value_t type) {
  const bool ok = type == json::value_t::number_unsigned ? v.is_number_integer()
                  : type == json::value_t::number_float  ? v.is_number()
                                                         : v.type() == type;
  if (!ok)
    throw RankError(fmt::format("{}: key '{}' is {}, not {}", at.file, at.path, v.type_name(),
                                json(type).type_name()),
                    MESHLM_HERE);
  return v;
}

// The value of `key` in the object `obj` (at `at`), of type `type`; an error
// naming the key when it is missing.
const json& member(const json& obj, const At& at, const char* key, json::value_t type) {
  const auto it = obj.find(key);
  if (it == obj.end())
    throw RankError(fmt::format("{}: key '{}' is missing", at.file, (at / key).path), MESHLM_HERE);
  return typed(*it, at / key, type);
}

// The same for a key that may be left out: null when it is, or when it is
// JSON null and `null_is_absent` (Hugging Face's optional fields: a
// normalizer, a post-processor, dropout, ...).
const json* optional_member(const json& obj, const At& at, const char* key, json::value_t type,
                            bool null_is_absent = false) {
  const auto it = obj.find(key);
  if (it == obj.end() || (null_is_absent && it->is_null())) return nullptr;
  return &typed(*it, at / key, type);
}

bool flag(const json& obj, const At& at, const char* key, bool fallback) {
  const json* v = optional_member(obj, at, key, json::value_t::boolean);
  return v ? v->get<bool>() : fallback;
}

std::string text_of(const json& obj, const At& at, const char* key, const std::string& fallback) {
  const json* v = optional_member(obj, at, key, json::value_t::string);
  return v ? v->get<std::string>() : fallback;
}

std::vector<std::pair<std::string, uint64_t>> read_vocab(const json& vocab, const std::string& where) {
  if (!vocab.is_object())
    throw RankError(where + ": the vocabulary is not a JSON object of token -> id", MESHLM_HERE);
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(vocab.size());
  for (const auto& [tok, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw RankError(fmt::format("{}: the id of token '{}' is not a non-negative integer", where, tok),
                      MESHLM_HERE);
    out.emplace_back(tok, id.get<uint64_t>());
  }
  return out;
}

std::pair<std::string, std::string> split_merge(const std::string& line, size_t n, const std::string& where) {
  const size_t sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string::npos)
    throw RankError(fmt::format("{}: merge {} ('{}') is not two tokens separated by one space",
                                where, n, line),
                    MESHLM_HERE);
  return {line.substr(0, sp), line.substr(sp + 1)};
}

// A regular expression that matches `text` literally (Hugging Face's
// regex::escape): each printable ASCII character that is not a letter or a
// digit escaped by a backslash, which PCRE2 reads as that character itself.
// Quoting the whole with \Q...\E would end at a "\E" in the text.
std::string literal_pattern(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    const bool alnum = (u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z');
    if (u > ' ' && u < 0x7f && !alnum) out += '\\';
    out += c;
  }
  return out;
}

// A pre-tokenizer of tokenizer.json (at `at`) into the spec's steps; true
// when it (or a step of its Sequence) is the ByteLevel one.
bool read_pre_tokenizer(const json& pt, const At& at, BpeSpec& spec) {
  typed(pt, at, json::value_t::object);
  const std::string type = member(pt, at, "type", json::value_t::string).get<std::string>();
  if (type == "Sequence") {
    const json& steps = member(pt, at, "pretokenizers", json::value_t::array);
    bool byte_level = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const At step = (at / "pretokenizers")[i];
      // A step after ByteLevel would see its byte-mapped characters ("Ġ"
      // for a space), which meshlm's steps, on the text's bytes, do not.
      if (byte_level)
        throw RankError(fmt::format("{}: {}: a pre-tokenizer step after ByteLevel is not supported "
                                    "(meshlm reads Split steps before ByteLevel)",
                                    at.file, step.path),
                        MESHLM_HERE);
      byte_level = read_pre_tokenizer(steps[i], step, spec);
    }
    return byte_level;
  }
  if (type == "ByteLevel") {
    spec.pre_tokenizer.push_back({flag(pt, at, "add_prefix_space", false),
                                  flag(pt, at, "use_regex", true) ? kGpt2Pattern : ""});
    return true;
  }
  if (type == "Split") {
    const json& pattern = member(pt, at, "pattern", json::value_t::object);
    const std::string behavior = text_of(pt, at, "behavior", "Isolated");
    const bool invert = flag(pt, at, "invert", false);
    if (behavior != "Isolated" || invert)
      throw RankError(fmt::format("{}: {}: Split pre-tokenizer with behavior '{}'{} is not supported "
                                  "(meshlm reads 'Isolated', not inverted)",
                                  at.file, at.path, behavior, invert ? " inverted" : ""),
                      MESHLM_HERE);
    const At p = at / "pattern";
    if (const json* re = optional_member(pattern, p, "Regex", json::value_t::string)) {
      spec.pre_tokenizer.push_back({false, re->get<std::string>()});
    } else if (const json* lit = optional_member(pattern, p, "String", json::value_t::string)) {
      spec.pre_tokenizer.push_back({false, literal_pattern(lit->get<std::string>())});
    } else {
      throw RankError(fmt::format("{}: {}: Split pre-tokenizer's pattern is neither Regex nor String",
                                  at.file, p.path),
                      MESHLM_HERE);
    }
    return false;
  }
  throw RankError(fmt::format("{}: pre-tokenizer '{}' is not supported (meshlm reads byte-level BPE: "
                              "ByteLevel, optionally after Split; SentencePiece models as "
                              "tokenizer.model)",
                              at.file, type),
                  MESHLM_HERE);
}

// The id a post-processor (at `at`) puts before a single sequence.
std::optional<uint64_t> read_bos(const json& pp, const At& at, const BpeSpec& spec) {
  typed(pp, at, json::value_t::object);
  const std::string type = member(pp, at, "type", json::value_t::string).get<std::string>();
  if (type == "ByteLevel") return std::nullopt;
  if (type == "Sequence") {
    const json& processors = member(pp, at, "processors", json::value_t::array);
    for (size_t i = 0; i < processors.size(); ++i)
      if (auto bos = read_bos(processors[i], (at / "processors")[i], spec)) return bos;
    return std::nullopt;
  }
  if (type != "TemplateProcessing")
    throw RankError(fmt::format("{}: post-processor '{}' is not supported (meshlm reads "
                                "TemplateProcessing and ByteLevel)",
                                at.file, type),
                    MESHLM_HERE);
  const json& single = member(pp, at, "single", json::value_t::array);
  for (size_t i = 0; i < single.size(); ++i) {
    const At p = (at / "single")[i];
    const json& piece = typed(single[i], p, json::value_t::object);
    if (piece.contains("Sequence")) return std::nullopt;
    if (const json* st = optional_member(piece, p, "SpecialToken", json::value_t::object)) {
      const std::string name = member(*st, p / "SpecialToken", "id", json::value_t::string).get<std::string>();
      for (const auto& a : spec.added)
        if (a.content == name) return a.id;
      throw RankError(fmt::format("{}: the post-processor's special token '{}' is not an added token",
                                  at.file, name),
                      MESHLM_HERE);
    }
  }
  return std::nullopt;
}

void read_added_tokens(const json& root, const At& at, BpeSpec& spec) {
  const json* list = optional_member(root, at, "added_tokens", json::value_t::array, true);
  if (!list) return;
  for (size_t i = 0; i < list->size(); ++i) {
    const At t_at = (at / "added_tokens")[i];
    const json& a = typed((*list)[i], t_at, json::value_t::object);
    BpeSpec::Added t;
    t.content = member(a, t_at, "content", json::value_t::string).get<std::string>();
    const json& id = member(a, t_at, "id", json::value_t::number_unsigned);
    if (id.get<int64_t>() < 0)
      throw RankError(fmt::format("{}: added token '{}' has a negative id", at.file, t.content),
                      MESHLM_HERE);
    t.id = id.get<uint64_t>();
    for (const char* f : {"single_word", "lstrip", "rstrip"})
      if (flag(a, t_at, f, false))
        throw RankError(fmt::format("{}: added token '{}' has {} = true, which meshlm does not "
                                    "support",
                                    at.file, t.content, f),
                        MESHLM_HERE);
    // Without the key, as Hugging Face's AddedToken::from: a special token
    // is not normalized, another is.
    t.normalized = flag(a, t_at, "normalized", !flag(a, t_at, "special", false));
    spec.added.push_back(std::move(t));
  }
}

std::unique_ptr<Tokenizer> hf_tokenizer_json(const json& root, const std::string& where) {
  const At at{where, ""};
  const json& model = member(root, at, "model", json::value_t::object);
  const At m = at / "model";
  const std::string type = text_of(model, m, "type", "BPE");
  if (type != "BPE")
    throw RankError(fmt::format("{}: model type '{}' is not supported (meshlm reads byte-level BPE "
                                "tokenizer.json files and SentencePiece tokenizer.model files)",
                                where, type),
                    MESHLM_HERE);
  if (const json* norm = optional_member(root, at, "normalizer", json::value_t::object, true))
    throw RankError(fmt::format("{}: normalizer '{}' is not supported (meshlm reads byte-level BPE "
                                "without a normalizer)",
                                where, text_of(*norm, at / "normalizer", "type", "?")),
                    MESHLM_HERE);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = optional_member(model, m, key, json::value_t::string, true);
        v && !v->get_ref<const std::string&>().empty())
      throw RankError(fmt::format("{}: model.{} is not supported", where, key), MESHLM_HERE);
  if (const json* d = optional_member(model, m, "dropout", json::value_t::number_float, true);
      d && d->get<double>() > 0)
    throw RankError(where + ": model.dropout is set: BPE dropout makes encoding random", MESHLM_HERE);
  if (flag(model, m, "byte_fallback", false))
    throw RankError(where + ": model.byte_fallback = true is not a byte-level BPE (use the "
                            "model's tokenizer.model)",
                    MESHLM_HERE);
  BpeSpec spec;
  spec.source = where;
  spec.vocab = read_vocab(member(model, m, "vocab", json::value_t::object), where);
  const json& merges = member(model, m, "merges", json::value_t::array);
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& mg = merges[i];
    if (mg.is_string()) {
      spec.merges.push_back(split_merge(mg.get<std::string>(), i + 1, where));
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      spec.merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
    } else {
      throw RankError(fmt::format("{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", where, i + 1),
                      MESHLM_HERE);
    }
  }
  spec.ignore_merges = flag(model, m, "ignore_merges", false);
  const json* pt = optional_member(root, at, "pre_tokenizer", json::value_t::object, true);
  if (!pt || !read_pre_tokenizer(*pt, at / "pre_tokenizer", spec))
    throw RankError(where + ": no ByteLevel pre-tokenizer: meshlm reads byte-level BPE only (use "
                            "the model's tokenizer.model for SentencePiece models)",
                    MESHLM_HERE);
  read_added_tokens(root, at, spec);
  if (const json* pp = optional_member(root, at, "post_processor", json::value_t::object, true))
    spec.bos = read_bos(*pp, at / "post_processor", spec);
  return std::make_unique<BpeTokenizer>(spec);
}

std::string beside(const std::string& path, std::initializer_list<const char*> names) {
  const fs::path dir = fs::path(path).parent_path();
  for (const char* n : names) {
    std::error_code ec;
    if (fs::is_regular_file(dir / n, ec)) return (dir / n).string();
  }
  return "";
}

// GPT-2's own pair: encoder.json (token -> id) and vocab.bpe (a "#version"
// line, then one merge per line). Added tokens are not split out of the text
// (OpenAI's encoder reads "<|endoftext|>" in a text as text).
std::unique_ptr<Tokenizer> gpt2_pair(const json& vocab, const std::string& path, const std::string& merges) {
  if (merges.empty())
    throw RankError(fmt::format("{} is a vocabulary without merges: name its merges file "
                                "(merges.txt or vocab.bpe) with --merges",
                                path),
                    MESHLM_HERE);
  BpeSpec spec;
  spec.source = path + " + " + merges;
  spec.vocab = read_vocab(vocab, path);
  std::istringstream in(read_text_file(merges));
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    auto m = split_merge(line, n, merges + " line " + std::to_string(n));
    spec.merges.push_back(std::move(m));
  }
  spec.pre_tokenizer.push_back({false, kGpt2Pattern});
  return std::make_unique<BpeTokenizer>(spec);
}

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& merges) {
  if (path == "byte") return byte_tokenizer();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* n : {"tokenizer.json", "vocab.json", "encoder.json", "tokenizer.model"})
      if (fs::is_regular_file(fs::path(path) / n, ec))
        return load_tokenizer((fs::path(path) / n).string(), merges);
    throw RankError("directory '" + path + "' has no tokenizer.json, vocab.json, encoder.json or "
                    "tokenizer.model",
                    MESHLM_HERE);
  }
  if (!fs::exists(path, ec)) throw RankError("tokenizer '" + path + "' does not exist", MESHLM_HERE);
  const std::string text = read_text_file(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    const json root = parse_json(text, path);
    if (root.contains("model") && root["model"].is_object()) {
      auto tok = hf_tokenizer_json(root, path);
      tok->files = {path};
      return tok;
    }
    std::string m = merges.empty() ? beside(path, {"merges.txt", "vocab.bpe"}) : merges;
    auto tok = gpt2_pair(root, path, m);
    tok->files = {path, m};
    return tok;
  }
  if (!merges.empty())
    throw RankError("--merges goes with a vocabulary in JSON (encoder.json, vocab.json); '" + path +
                        "' is not JSON",
                    MESHLM_HERE);
  auto tok = sentencepiece_tokenizer(path);
  tok->files = {path};
  return tok;
}

}  // namespace meshlm::text
