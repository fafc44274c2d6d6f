// Token data: a flat array of token ids, read on demand, cut into training
// windows and handed out as (B, T) batches, one DP slice per rank.
//
// Two file formats (docs/formats.md), told apart by their first bytes:
//
//  * HDF5: a 1-D dataset "tokens" of uint16 or uint32 (any 2- or 4-byte
//    integer type is accepted); optional root attributes "vocab_size" and
//    "format_version" (= 1).
//  * Raw: a 24-byte little-endian header, then the ids, little-endian:
//        offset 0   char[8]  magic "MESHTOK1"
//        offset 8   uint32   format_version (= 1)
//        offset 12  uint32   bytes_per_token (2 or 4)
//        offset 16  uint64   n_tokens
//        offset 24  n_tokens ids of bytes_per_token bytes each
//
// Windows. With sequence length T, window w covers tokens [w*T, w*T + T]
// (T + 1 tokens; consecutive windows share one token), so a file of n
// tokens has (n - 1) / T windows. inputs = window[0:T], targets =
// window[1:T+1].
//
// Order. Windows are consumed as one endless stream, epoch after epoch: in
// file order, or shuffled by a permutation that depends only on (seed,
// epoch) and is the same on every platform. Each step takes the next
// B * dp_size windows of the stream; DP rank r takes the r-th block of B.
// So the union of all DP ranks' batches at step s is exactly what a single
// rank with batch B * dp_size would see, whatever dp_size is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/alloc.h"

namespace meshlm::io {

inline constexpr int kTokensFormatVersion = 1;
inline constexpr char kRawTokensMagic[9] = "MESHTOK1";
inline constexpr uint64_t kRawTokensHeaderBytes = 24;

// The HDF5 dataset of the training tokens, and of the held-out tokens that
// `meshlm tokenize --val-fraction` writes beside them (data.val_path).
inline constexpr char kTokensDataset[] = "tokens";
inline constexpr char kValTokensDataset[] = "val_tokens";

// Read access to one token file; reads only what is asked for (HDF5
// hyperslab or pread), never the whole file. Move-only; keeps the file open.
class TokenReader {
public:
  // Detects the format and validates the header / dataset; throws RankError
  // naming the file on any problem, and without opening it when it is not
  // a regular file (a FIFO would block, a directory cannot be one).
  // `dataset`: the HDF5 dataset to read ("tokens", or "val_tokens" for the
  // held-out part); a raw file holds "tokens" only. max_id_attr() is the
  // dataset's own "max_id" attribute, else for "tokens" the root's (meshlm
  // tokenize's bounds both datasets; a file written by hand may bound
  // "tokens" alone, so a held-out dataset without its own is scanned).
  static TokenReader open(const std::string& path, const std::string& dataset = kTokensDataset);
  // True when `path` is a regular HDF5 file holding the dataset `dataset`
  // (false for anything else, unreadable files included).
  static bool has_dataset(const std::string& path, const std::string& dataset);

  TokenReader(TokenReader&&) noexcept;
  TokenReader& operator=(TokenReader&&) noexcept;
  ~TokenReader();

  uint64_t size() const;                 // number of tokens
  int bytes_per_token() const;           // 2 or 4, as stored
  int64_t vocab_size_attr() const;       // HDF5 "vocab_size" attribute; 0 when absent or raw
  // HDF5 "max_id" attribute (meshlm tokenize writes it): the largest id in
  // the file; -1 when absent or raw.
  int64_t max_id_attr() const;
  // The largest id of tokens [start, start + count), read in chunks.
  uint32_t max_id(uint64_t start, uint64_t count) const;
  // The position of the first token of [start, start + count) whose id is
  // >= limit, or UINT64_MAX.
  uint64_t first_at_least(uint64_t start, uint64_t count, uint64_t limit) const;
  bool is_hdf5() const;
  const std::string& path() const;
  const std::string& dataset() const;  // "tokens" for a raw file

  // Copies tokens [start, start + count) to out[0:count].
  void read(uint64_t start, uint64_t count, int32_t* out) const;

private:
  struct Impl;
  explicit TokenReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where a BatchLoader stands in its stream of windows: the next step starts
// at index `position` of epoch `epoch`'s order. Saved in checkpoints.
struct DataCursor {
  uint64_t epoch = 0;
  uint64_t position = 0;  // in [0, windows_per_epoch)
  bool operator==(const DataCursor&) const = default;
};

class BatchLoader {
public:
  // `reader` must outlive the loader. B = batch per rank, T = sequence
  // length. Throws RankError when the file has fewer than T + 1 tokens.
  BatchLoader(const TokenReader& reader, int B, int T, bool shuffle, uint64_t seed,
              int vocab_size, int dp_rank = 0, int dp_size = 1);

  // Fills this rank's batch of one step and advances the cursor by
  // B * dp_size windows. inputs and targets are (B, T), row-major. Throws
  // RankError naming the file, position and value for an id >= vocab_size.
  void next(int32_t* inputs, int32_t* targets);

  uint64_t windows_per_epoch() const { return n_windows_; }
  DataCursor cursor() const { return cursor_; }
  // Resumes from a saved cursor (same file, T, shuffle and seed).
  void set_cursor(const DataCursor& c);

private:
  // Window index of element `pos` of epoch `epoch`'s order.
  uint64_t window_at(uint64_t epoch, uint64_t pos);

  const TokenReader* reader_;
  int B_, T_, vocab_size_, dp_rank_, dp_size_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t n_windows_;
  DataCursor cursor_;
  Buffer order_;                       // (n_windows) uint32: permutation of one epoch
  uint64_t order_epoch_ = UINT64_MAX;  // the epoch whose permutation order_ holds
  std::vector<int32_t> window_;        // (T+1) tokens of one window
};

// The permutation of [0, n) used by shuffled loading: Fisher-Yates driven by
// splitmix64 seeded from (seed, epoch). Identical on every platform and
// standard library. Exposed for tests.
void shuffled_order(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t* out);

// True when `path` is a token file meshlm wrote (write_tokens_h5, meshlm
// tokenize; every version since format_version 1): an HDF5 file with the
// root attributes vocab_size and format_version and no object but the
// datasets "tokens" and, optionally, "val_tokens". Another tool's file with a
// "tokens" dataset is not one: meshlm never replaces what it cannot
// recognise as its own.
bool is_token_file_h5(const std::string& path);

// Throws RankError naming `path` when it exists and is not a token file
// meshlm wrote (is_token_file_h5), before anything is written over it.
void check_replaceable_token_file(const std::string& path);

// Writes `ids` as an HDF5 token file: dataset "tokens" stored as uint16 when
// vocab_size <= 65536, else uint32; root attributes vocab_size and
// format_version. Throws (leaving no file behind) for an id >= vocab_size.
void write_tokens_h5(const std::string& path, const std::vector<uint32_t>& ids, int vocab_size);

// Writes `ids` as a raw token file with 2 or 4 bytes per token. Throws
// (leaving no file behind) for an id that does not fit.
void write_tokens_raw(const std::string& path, const std::vector<uint32_t>& ids,
                      int bytes_per_token);

// Byte-level tokenizer (vocabulary 256, token = byte value): reads the text
// file and writes its tokens with write_tokens_h5. Returns the number of
// tokens. Throws naming the file when it is unreadable or empty.
uint64_t tokenize_bytes(const std::string& text_path, const std::string& out_path);

}  // namespace meshlm::io
