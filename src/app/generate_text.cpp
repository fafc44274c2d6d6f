// Text in and out of `meshlm generate` (app/generate_text.h). The text
// tokenizers (src/text) are not in this build yet: --tokenizer is refused and
// no model directory's tokenizer is looked for, so only --prompt-ids and
// --print ids work.
#include "app/generate_text.h"

#include "core/error.h"

namespace meshlm {

std::unique_ptr<TextCodec> open_text_codec(const std::string& path, const std::string& merges,
                                           bool given, const std::string& model_dir) {
  if (given)
    throw RankError("--tokenizer '" + path + "': this meshlm has no text tokenizers yet; give "
                        "--prompt-ids and --print ids",
                    MESHLM_HERE);
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
