// Text in and out of `meshlm generate` (app/generate.h): the prompt's ids
// from its text by the model's tokenizer (text/tokenizer.h), and the
// generated ids streamed to stdout as text.
//
// Streaming: only the generated text, each id's bytes (Tokenizer::
// token_bytes: their concatenation is the text, and a continuation keeps
// the space a SentencePiece piece starts with) written and flushed as it
// comes, but the bytes of a UTF-8 character that is not complete yet (a
// character split over two tokens) held back until it is; at the end
// whatever is held goes out, then a newline. The end-of-text id is not
// written; an id the tokenizer has no token for (a model's padded
// embedding rows) is named in a warning on stderr.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshlm {

// Where the generated ids go, one at a time.
class TokenSink {
public:
  virtual ~TokenSink() = default;
  virtual void put(uint32_t id) = 0;
  // After the last id.
  virtual void finish() = 0;
};

class TextCodec {
public:
  virtual ~TextCodec() = default;
  // The ids of `text`, the tokenizer's BOS id first when `bos` and it has
  // one; an id >= `vocab_size` (the model's) is an error naming it.
  virtual std::vector<int32_t> encode(const std::string& text, bool bos, int vocab_size) const = 0;
  // The tokenizer's end-of-text id, if any.
  virtual std::optional<uint32_t> eot() const = 0;
  // Streams the text of the ids put (which follow `prompt`) to stdout; the
  // ids of `stops` (those that end generation) have none.
  virtual std::unique_ptr<TokenSink> sink(const std::vector<int32_t>& prompt,
                                          const std::vector<uint32_t>& stops) const = 0;
};

// The tokenizer `path` names (with `merges` for GPT-2's vocab.json) when
// `given`; else the one in `model_dir` (a Hugging Face directory's
// tokenizer.json, vocab.json + merges.txt or tokenizer.model) when there is
// one; else null. RankError naming the file when it cannot be read.
std::unique_ptr<TextCodec> open_text_codec(const std::string& path, const std::string& merges,
                                           bool given, const std::string& model_dir);

// The length of `s` less the bytes of an incomplete UTF-8 character at its
// end (at most 3): what can be written now.
size_t utf8_complete_prefix(const std::string& s);

}  // namespace meshlm
