#include "text/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <fmt/format.h>

#include "core/error.h"

namespace meshlm::text {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto status = sp_.Load(path);
    if (!status.ok())
      throw RankError(fmt::format("{}: not a tokenizer.json, encoder.json or SentencePiece model "
                                  "(libsentencepiece: {})",
                                  path, status.ToString()),
                      MESHLM_HERE);
  }

  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok())
      throw RankError("SentencePiece failed to encode: " + status.ToString(), MESHLM_HERE);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string token_bytes(uint32_t id) const override {
    check(id);
    const int i = static_cast<int>(id);
    if (sp_.IsControl(i)) return "";
    if (sp_.IsByte(i)) {
      // "<0x41>"
      const std::string& p = sp_.IdToPiece(i);
      return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
    }
    std::string piece = sp_.IdToPiece(i);
    if (sp_.IsUnknown(i)) return " \xE2\x81\x87 ";  // what SentencePiece decodes <unk> to
    // U+2581 ("▁") stands for a space.
    std::string out;
    for (size_t k = 0; k < piece.size();) {
      if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        k += 3;
      } else {
        out += piece[k++];
      }
    }
    return out;
  }

  std::string decode(std::span<const uint32_t> ids) const override {
    for (uint32_t id : ids) check(id);
    std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    const auto status = sp_.Decode(v, &text);
    if (!status.ok())
      throw RankError("SentencePiece failed to decode: " + status.ToString(), MESHLM_HERE);
    return text;
  }

  uint64_t vocab_size() const override { return static_cast<uint64_t>(sp_.GetPieceSize()); }

  std::optional<uint32_t> token_id(std::string_view content) const override {
    const int id = sp_.PieceToId(content);
    // PieceToId answers the unknown id for a piece it does not have.
    if (id < 0 || sp_.IdToPiece(id) != content) return std::nullopt;
    return static_cast<uint32_t>(id);
  }

  std::optional<uint32_t> bos_id() const override {
    const int id = sp_.bos_id();
    if (id < 0) return std::nullopt;
    return static_cast<uint32_t>(id);
  }

  // The model's own end of sequence (trainer option eos_id), whatever its
  // piece is called (eos_piece: "</s>" by default, "<eos>" in Gemma's).
  std::optional<uint32_t> eot_id() const override {
    const int id = sp_.eos_id();
    if (id < 0) return Tokenizer::eot_id();
    return static_cast<uint32_t>(id);
  }

  std::string kind() const override { return "sentencepiece"; }

private:
  void check(uint32_t id) const {
    if (!has_token(id)) throw RankError(fmt::format("token id {} {}", id, why_no_token(id)), MESHLM_HERE);
  }
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace meshlm::text
