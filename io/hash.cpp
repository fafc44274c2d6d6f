#include "io/hash.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "core/error.h"

namespace meshlm::io {

namespace {

std::string to_hex(XXH128_hash_t h) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, h);
  static const char kDigits[] = "0123456789abcdef";
  std::string s(2 * sizeof(canon.digest), '0');
  for (size_t i = 0; i < sizeof(canon.digest); ++i) {
    s[2 * i] = kDigits[canon.digest[i] >> 4];
    s[2 * i + 1] = kDigits[canon.digest[i] & 0xf];
  }
  return s;
}

XXH3_state_t* new_state() {
  XXH3_state_t* s = XXH3_createState();
  if (!s) throw std::bad_alloc();
  return s;
}

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string xxh3_128_hex(const void* data, size_t bytes) {
  return to_hex(XXH3_128bits(data, bytes));
}

uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string xxh3_128_file(const std::string& path,
                          const std::function<void(size_t done, size_t total)>& progress) {
  auto fail = [&path](const char* what) {
    throw RankError("cannot " + std::string(what) + " '" + path + "' to hash it: " +
                        std::strerror(errno),
                    MESHLM_HERE);
  };
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail("open");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("stat");
  const size_t total = static_cast<size_t>(st.st_size);

  Xxh3_128 h;
  std::vector<char> buf(kHashChunkBytes);
  size_t done = 0;
  for (;;) {
    ssize_t n = ::read(f.fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("read");
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    done += static_cast<size_t>(n);
    if (progress) progress(done, total);
  }
  return h.hex();
}

// ---------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------

void Xxh3_128::Free::operator()(XXH3_state_s* s) const { XXH3_freeState(s); }
void Xxh3_64::Free::operator()(XXH3_state_s* s) const { XXH3_freeState(s); }

Xxh3_128::Xxh3_128() : state_(new_state()) { XXH3_128bits_reset(state_.get()); }
Xxh3_128::~Xxh3_128() = default;
Xxh3_128::Xxh3_128(Xxh3_128&&) noexcept = default;
Xxh3_128& Xxh3_128::operator=(Xxh3_128&&) noexcept = default;

Xxh3_128& Xxh3_128::update(const void* data, size_t bytes) {
  if (bytes > 0) XXH3_128bits_update(state_.get(), data, bytes);
  return *this;
}

std::string Xxh3_128::hex() const { return to_hex(XXH3_128bits_digest(state_.get())); }

Xxh3_64::Xxh3_64() : state_(new_state()) { XXH3_64bits_reset(state_.get()); }
Xxh3_64::~Xxh3_64() = default;
Xxh3_64::Xxh3_64(Xxh3_64&&) noexcept = default;
Xxh3_64& Xxh3_64::operator=(Xxh3_64&&) noexcept = default;

Xxh3_64& Xxh3_64::update(const void* data, size_t bytes) {
  if (bytes > 0) XXH3_64bits_update(state_.get(), data, bytes);
  return *this;
}

uint64_t Xxh3_64::value() const { return XXH3_64bits_digest(state_.get()); }

}  // namespace meshlm::io
