// Tokenizers: text <-> token ids, exactly as the models' own reference
// implementations give them (docs/formats.md, "Tokenizers").
//
//  * byte: every byte is its own id (vocabulary 256), meshlm's own.
//  * Byte-level BPE (GPT-2, Llama 3 and the models built the same way), from
//    a Hugging Face tokenizer.json (model type "BPE" with a ByteLevel
//    pre-tokenizer, optionally after a Split by a regular expression) or
//    from GPT-2's original pair of files (encoder.json / vocab.json with
//    vocab.bpe / merges.txt). The pre-tokenizers' regular expressions run
//    through PCRE2 with Unicode properties (text/pretokenize.h).
//  * SentencePiece (tokenizer.model: Llama 2 and others) through
//    libsentencepiece.
//
// Other tokenizer.json model types (WordPiece, Unigram, ...) are refused by
// name. Every load error is a RankError naming the file and, where there is
// one, the key or line.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshlm::text {

class Tokenizer {
public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`. Special tokens written in the text
  // (tokenizer.json's added tokens, e.g. "<|endoftext|>") become their ids,
  // as Hugging Face's encode does. Never adds BOS or EOS itself (bos_id()
  // says what a post-processor would add). Bytes that are not valid UTF-8
  // are encoded as bytes (byte-level BPE) or as SentencePiece's unknown or
  // byte-fallback pieces; decode() gives them back where the model can.
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;

  // The bytes of one token (for streaming: the concatenation of the bytes
  // of a sequence of ids is its text; a UTF-8 character may be split over
  // two tokens). Throws RankError for an id without a token (has_token).
  virtual std::string token_bytes(uint32_t id) const = 0;

  // The text of `ids`: the concatenation of their token_bytes, with the
  // decoder's own rules applied (SentencePiece: the leading space of
  // "\u2581" pieces).
  virtual std::string decode(std::span<const uint32_t> ids) const;

  // 1 + the largest id the tokenizer can give (added tokens included).
  virtual uint64_t vocab_size() const = 0;

  // Whether `id` is a token's: below vocab_size() and, for a tokenizer.json
  // whose ids leave gaps, one of the ids it assigns.
  virtual bool has_token(uint32_t id) const { return id < vocab_size(); }

  // Why `id` is not a token, to follow "token id N" in a message ("is not
  // in the tokenizer's vocabulary (size V)", or that the tokenizer leaves it
  // unassigned); "" when it is one.
  std::string why_no_token(uint32_t id) const;

  // The id of a token given by its content ("<|endoftext|>"), if it has one.
  virtual std::optional<uint32_t> token_id(std::string_view content) const = 0;

  // The id a post-processor puts before each sequence (Llama 3's
  // <|begin_of_text|>, SentencePiece's <s> for Llama 2), if any.
  virtual std::optional<uint32_t> bos_id() const = 0;

  // The end-of-text id: the first of "<|endoftext|>", "<|end_of_text|>",
  // "</s>" that the tokenizer has, if any. SentencePiece: the model's eos
  // id whatever its piece is named (Gemma's "<eos>"), by the names only
  // when the model has none.
  virtual std::optional<uint32_t> eot_id() const;

  // "byte", "bpe" or "sentencepiece".
  virtual std::string kind() const = 0;

  // The files it was read from: the tokenizer file, then the merges file of
  // GPT-2's pair (none for the byte tokenizer). Set by load_tokenizer.
  std::vector<std::string> files;
};

// The byte-level tokenizer (vocabulary 256, id = byte value; no end-of-text).
std::unique_ptr<Tokenizer> byte_tokenizer();

// Loads the tokenizer of `path`:
//   "byte"                        the byte-level tokenizer;
//   *.json with a "model" key     a Hugging Face tokenizer.json;
//   *.json without one            GPT-2's encoder.json/vocab.json: `merges`
//                                 names vocab.bpe/merges.txt (required);
//   a SentencePiece model         (tokenizer.model, protobuf).
// A directory is looked into for tokenizer.json, then vocab.json +
// merges.txt, then tokenizer.model. Throws RankError naming the file and
// what is wrong with it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& merges = "");

}  // namespace meshlm::text
