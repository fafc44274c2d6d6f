// Text in and out of `meshlm generate` (app/generate_text.h).
#include "app/generate_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer.h"

namespace meshlm {

namespace {

// The generated ids' text on stdout: each id's bytes (Tokenizer::token_bytes,
// whose concatenation is the text: a continuation of the prompt keeps the
// space a SentencePiece piece starts with), the bytes of an incomplete UTF-8
// character held back until it is complete.
class TextSink final : public TokenSink {
public:
  TextSink(const text::Tokenizer& tok, std::vector<uint32_t> stops) : tok_(tok), stops_(std::move(stops)) {}
  void put(uint32_t id) override {
    if (std::find(stops_.begin(), stops_.end(), id) != stops_.end()) return;
    if (!tok_.has_token(id)) {
      // A row of the model's embedding the tokenizer has no token for: past
      // its vocabulary (padded rows) or a gap in a tokenizer.json's ids.
      log::write_line(stderr, fmt::format("WARNING: generated id {} {}; no text for it\n", id,
                                          tok_.why_no_token(id)));
      return;
    }
    held_ += tok_.token_bytes(id);
    const size_t n = utf8_complete_prefix(held_);
    write(n);
  }
  void finish() override {
    write(held_.size());
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

private:
  void write(size_t n) {
    if (n == 0) return;
    std::fwrite(held_.data(), 1, n, stdout);
    std::fflush(stdout);
    held_.erase(0, n);
  }
  const text::Tokenizer& tok_;
  std::vector<uint32_t> stops_;  // the ids that end generation: no text
  std::string held_;
};

class TokenizerCodec final : public TextCodec {
public:
  explicit TokenizerCodec(std::unique_ptr<text::Tokenizer> tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(const std::string& text, bool bos, int vocab_size) const override {
    std::vector<uint32_t> ids;
    const std::optional<uint32_t> b = tok_->bos_id();
    if (bos && b) ids.push_back(*b);
    tok_->encode(text, ids);
    if (bos && b && ids.size() > 1 && ids[1] == *b) ids.erase(ids.begin());  // written in the text
    std::vector<int32_t> out;
    for (uint32_t id : ids) {
      if (id >= static_cast<uint32_t>(vocab_size))
        throw RankError(fmt::format("--prompt: the tokenizer gives id {}, outside the model's "
                                    "vocabulary [0, {}): is it the model's tokenizer?",
                                    id, vocab_size),
                        MESHLM_HERE);
      out.push_back(static_cast<int32_t>(id));
    }
    return out;
  }
  std::optional<uint32_t> eot() const override { return tok_->eot_id(); }
  std::unique_ptr<TokenSink> sink(const std::vector<int32_t>&,
                                  const std::vector<uint32_t>& stops) const override {
    return std::make_unique<TextSink>(*tok_, stops);
  }

private:
  std::unique_ptr<text::Tokenizer> tok_;
};

// Whether a Hugging Face directory holds a tokenizer load_tokenizer finds.
bool has_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* n : {"tokenizer.json", "vocab.json", "encoder.json", "tokenizer.model"})
    if (fs::is_regular_file(fs::path(dir) / n, ec)) return true;
  return false;
}

}  // namespace

std::unique_ptr<TextCodec> open_text_codec(const std::string& path, const std::string& merges,
                                           bool given, const std::string& model_dir) {
  if (given) return std::make_unique<TokenizerCodec>(text::load_tokenizer(path, merges));
  if (!model_dir.empty() && has_tokenizer(model_dir))
    return std::make_unique<TokenizerCodec>(text::load_tokenizer(model_dir));
  return nullptr;
}

size_t utf8_complete_prefix(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte of the last
  // character; keep it only if all its bytes are there.
  const size_t n = s.size();
  size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 3) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) break;  // not a continuation byte
    --i;
    ++cont;
  }
  if (i == 0) return n;  // only continuation bytes: nothing to wait for
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  const int need = lead < 0xC0 ? 0 : lead < 0xE0 ? 1 : lead < 0xF0 ? 2 : lead < 0xF8 ? 3 : 0;
  if (need > cont) return i - 1;  // the character is not complete yet
  return n;
}

}  // namespace meshlm
