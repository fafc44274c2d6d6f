// The token file `meshlm tokenize` writes, by every rank of a job at once
// (parallel HDF5): each rank writes its own stretch of ids, in rank order, so
// the file is the one a single rank would write (docs/formats.md, "Token
// files").
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace meshlm::io {

// One rank's part of a dataset: `count` ids at `offset` of `total`.
struct TokenPart {
  const uint32_t* ids = nullptr;
  uint64_t count = 0, offset = 0, total = 0;
};

// The root attributes of a tokenized corpus.
struct TokenFileAttrs {
  uint64_t vocab_size = 0;
  int64_t eot_id = -1;  // -1: none
  int64_t bos_id = -1;  // -1: none
  uint64_t documents = 0, val_documents = 0, bytes_read = 0;
  std::string tokenizer;       // "byte", "bpe", "sentencepiece"
  std::string tokenizer_file;  // as given ("" for byte)
  uint64_t tokenizer_xxh3 = 0, merges_xxh3 = 0;
  int64_t max_id = -1;  // the largest id of both datasets
};

// Collective over `comm`: creates `path` (truncating it) and writes the
// dataset "tokens" from `train` and, when val.total > 0, "val_tokens" from
// `val`, stored as uint16 when attrs.vocab_size <= 65536 else uint32, with
// the attributes. Every rank passes the same attrs and totals. Throws
// RankError naming the file.
void write_token_file(const std::string& path, MPI_Comm comm, const TokenPart& train,
                      const TokenPart& val, const TokenFileAttrs& attrs);

// XXH3-64 (seed 0) of a file's bytes; RankError naming it when unreadable.
uint64_t file_xxh3(const std::string& path);

}  // namespace meshlm::io
