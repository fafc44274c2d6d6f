#include "io/token_writer.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/tokens.h"

namespace meshlm::io {

namespace {

void write_part(hid_t file, const char* name, hid_t file_type, const TokenPart& part) {
  const std::vector<hsize_t> dims = {static_cast<hsize_t>(part.total)};
  h5::Dataset dset = h5::create_dataset(file, name, file_type, dims);
  // Independent writes: each rank its own stretch (HDF5 converts the uint32
  // ids to the stored type on the way).
  if (part.count > 0) h5::write_rows(dset, part.offset, part.count, H5T_NATIVE_UINT32, part.ids);
}

}  // namespace

void write_token_file(const std::string& path, MPI_Comm comm, const TokenPart& train,
                      const TokenPart& val, const TokenFileAttrs& a) {
  h5::File file = ckpt::create_parallel(path, comm);
  const hid_t file_type = a.vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
  write_part(file, "tokens", file_type, train);
  if (val.total > 0) write_part(file, "val_tokens", file_type, val);
  h5::write_scalar_attr<int64_t>(file, "vocab_size", static_cast<int64_t>(a.vocab_size));
  h5::write_scalar_attr<int64_t>(file, "max_id", a.max_id);
  h5::write_scalar_attr<int32_t>(file, "format_version", kTokensFormatVersion);
  h5::write_scalar_attr<int64_t>(file, "eot_id", a.eot_id);
  h5::write_scalar_attr<int64_t>(file, "bos_id", a.bos_id);
  h5::write_scalar_attr<uint64_t>(file, "documents", a.documents);
  h5::write_scalar_attr<uint64_t>(file, "val_documents", a.val_documents);
  h5::write_scalar_attr<uint64_t>(file, "bytes_read", a.bytes_read);
  h5::write_string_attr(file, "tokenizer", a.tokenizer);
  h5::write_string_attr(file, "tokenizer_file", a.tokenizer_file);
  h5::write_scalar_attr<uint64_t>(file, "tokenizer_xxh3", a.tokenizer_xxh3);
  if (a.merges_xxh3 != 0) h5::write_scalar_attr<uint64_t>(file, "merges_xxh3", a.merges_xxh3);
  h5::close_file(file, path);
}

uint64_t file_xxh3(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RankError("cannot read '" + path + "' to hash it", MESHLM_HERE);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  return xxh3_64(bytes.data(), bytes.size());
}

}  // namespace meshlm::io
