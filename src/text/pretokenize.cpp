#include "text/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace meshlm::text {

size_t valid_utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The well-formed sequences of the Unicode standard (table 3-7): the
    // second byte's range depends on the first.
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return n;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(new Impl) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw RankError(where + ": the regular expression '" + pattern + "' does not compile: " +
                        reinterpret_cast<const char*>(buf) + " (at offset " +
                        std::to_string(err_offset) + ")",
                    MESHLM_HERE);
  }
  // JIT where the platform has it; the interpreter gives the same matches.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
  impl_->match = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!impl_->match) throw RankError(where + ": out of memory for a regex match", MESHLM_HERE);
}

Regex::~Regex() {
  pcre2_match_data_free(impl_->match);
  pcre2_code_free(impl_->code);
}

void Regex::split(std::string_view text, std::vector<std::string_view>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t offset = 0, last = 0;
  while (offset < n) {
    // The caller validated the UTF-8 once: PCRE2 would otherwise check the
    // whole subject again on every call.
    const int rc = pcre2_match(impl_->code, subject, n, offset, PCRE2_NO_UTF_CHECK, impl_->match,
                               nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      throw RankError(std::string("pre-tokenizer regex failed: ") +
                          reinterpret_cast<const char*>(buf),
                      MESHLM_HERE);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(impl_->match);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {
      // An empty match: step over one character and look again.
      offset = start + 1;
      while (offset < n && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = offset = end;
  }
  if (last < n) out.push_back(text.substr(last));
}

}  // namespace meshlm::text
