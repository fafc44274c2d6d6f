// Fuzz target: opening and reading a token file (io/tokens.h):
// TokenReader::open (the format sniffing, the raw header, the HDF5 dataset
// and its attributes), TokenReader::read and a BatchLoader over the file.
//
// Two kinds of input:
//  * a file as it is, when the input starts with the raw magic "MESHTOK1"
//    (tests/fuzz/corpus/tokens/raw*.bin, written by io::write_tokens_raw),
//    or with the HDF5 signature when MESHLM_FUZZ_RAW_HDF5=1 is set
//    (tests/fuzz/corpus/tokens/*.h5, written by io::write_tokens_h5).
//    That last kind is off by default: a token file's HDF5 metadata carries
//    no checksums (HDF5's default, earliest file format, as h5py writes it
//    too), so damaged bytes reach HDF5's own parser, and HDF5 1.10.8 reads
//    freed memory (H5Aexists, from TokenReader::open) on a mutated file
//    within a minute of fuzzing: HDF5's bug, which meshlm cannot catch and
//    which would fail every run. Set the variable to look for more.
//  * otherwise a description, read by ByteReader, of an HDF5 token file that
//    the target writes with the HDF5 library and then opens: the dataset's
//    name, element type (every integer width, both byte orders, signed,
//    reduced precision, floats, strings, enums, ...), rank, extent, storage
//    (contiguous, chunked, compressed, never written), the ids, and the
//    vocab_size attribute (on the file or the dataset, any type). HDF5 writes
//    a well-formed file, so the fuzzer spends its time on meshlm's checks
//    rather than on HDF5's rejection of damaged bytes.
//
// A RankError is the expected answer to a bad file; any other exception, a
// crash or a sanitizer report is a finding.
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "fuzz_targets.h"
#include "io/h5.h"
#include "io/tokens.h"

namespace meshlm::fuzz {

namespace {

namespace h5 = io::h5;

// The element type of the "tokens" dataset; the caller closes it.
hid_t pick_type(ByteReader& in) {
  static const hid_t* const kPlain[] = {
      &H5T_STD_U16LE_g, &H5T_STD_U32LE_g, &H5T_STD_U16BE_g, &H5T_STD_U32BE_g,
      &H5T_STD_I16LE_g, &H5T_STD_I32LE_g, &H5T_STD_I16BE_g, &H5T_STD_I32BE_g,
      &H5T_STD_U8LE_g,  &H5T_STD_I8LE_g,  &H5T_STD_U64LE_g, &H5T_STD_I64LE_g,
      &H5T_IEEE_F32LE_g, &H5T_IEEE_F64LE_g, &H5T_STD_B16LE_g, &H5T_STD_B32LE_g};
  H5open();
  const unsigned k = in.pick(20);
  if (k < 16) return H5Tcopy(*kPlain[k]);
  if (k == 16) {  // an integer of 2 or 4 bytes holding fewer bits, at an offset
    hid_t t = H5Tcopy(in.u8() & 1 ? H5T_STD_U32LE : H5T_STD_I16LE);
    const size_t bits = 8 * H5Tget_size(t);
    const size_t prec = 1 + in.pick(static_cast<unsigned>(bits));
    H5Tset_precision(t, prec);
    H5Tset_offset(t, in.pick(static_cast<unsigned>(bits - prec + 1)));
    return t;
  }
  if (k == 17) {  // a fixed-length string of 2 or 4 bytes
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, in.u8() & 1 ? 2 : 4);
    return t;
  }
  if (k == 18) {  // an enum over uint16
    hid_t t = H5Tenum_create(H5T_NATIVE_UINT16);
    uint16_t a = 0, b = 1;
    H5Tenum_insert(t, "a", &a);
    H5Tenum_insert(t, "b", &b);
    return t;
  }
  hid_t t = H5Tcreate(H5T_OPAQUE, in.u8() & 1 ? 2 : 4);  // opaque bytes
  H5Tset_tag(t, "ids");
  return t;
}

// Writes the vocab_size attribute, of a type and shape from the input, on `obj`.
void write_vocab_attr(ByteReader& in, hid_t obj) {
  const unsigned kind = in.pick(6);
  const hsize_t two = 2;
  h5::Dataspace space(kind == 5 ? H5Screate_simple(1, &two, nullptr) : H5Screate(H5S_SCALAR));
  int64_t v[2] = {static_cast<int64_t>(in.u64()), static_cast<int64_t>(in.u32())};
  if (in.one_in(2)) v[0] = static_cast<int64_t>(in.u32() % 70000);  // plausible sizes
  hid_t mem = H5T_NATIVE_INT64, file = H5T_STD_I64LE;
  double d = static_cast<double>(v[0]);
  const char* s = "50257";
  switch (kind) {
    case 1: file = H5T_STD_U64LE; break;
    case 2: file = H5T_STD_I32LE; mem = H5T_NATIVE_INT64; break;
    case 3: file = H5T_IEEE_F64LE; mem = H5T_NATIVE_DOUBLE; break;
    case 4: file = H5T_C_S1; break;
    default: break;
  }
  h5::Datatype str_type;
  if (kind == 4) {
    str_type = h5::Datatype(H5Tcopy(H5T_C_S1));
    H5Tset_size(str_type, 6);
    file = mem = str_type;
  }
  h5::Attribute attr(H5Acreate2(obj, "vocab_size", file, space, H5P_DEFAULT, H5P_DEFAULT));
  if (attr.valid())
    H5Awrite(attr, mem, kind == 3 ? static_cast<const void*>(&d)
                    : kind == 4 ? static_cast<const void*>(s)
                                : static_cast<const void*>(v));
}

// Writes the HDF5 token file that the input describes to `path`.
void build_hdf5(ByteReader& in, const std::string& path) {
  h5::silence_errors();
  h5::PropList fcpl(H5Pcreate(H5P_FILE_CREATE));
  if (in.one_in(8)) H5Pset_userblock(fcpl, 512u << in.pick(3));  // signature not at 0
  h5::PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
  switch (in.pick(3)) {
    case 1: H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18); break;
    case 2: H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST); break;
    default: break;
  }
  h5::File file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl));
  if (!file.valid()) {
    std::fprintf(stderr, "meshlm fuzz: cannot create %s\n", path.c_str());
    std::abort();
  }

  const unsigned where = in.pick(16);  // where "tokens" is, and what it is
  const std::string name = where == 1 ? "tokens_" : where == 2 ? "group/tokens" : "tokens";
  if (where == 3) {  // a group named tokens
    h5::Group g(H5Gcreate2(file, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    return;
  }
  if (where == 4) {  // a dangling soft link, or an external link to no file
    if (in.u8() & 1)
      H5Lcreate_soft("/nowhere", file, "tokens", H5P_DEFAULT, H5P_DEFAULT);
    else
      H5Lcreate_external("missing-file.h5", "/tokens", file, "tokens", H5P_DEFAULT, H5P_DEFAULT);
    return;
  }
  if (where == 2) h5::Group g(H5Gcreate2(file, "group", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));

  h5::Datatype type(pick_type(in));
  const size_t esize = H5Tget_size(type);
  // Shape: mostly 1-D of 16 + k elements; sometimes 0 elements, scalar,
  // null or 2-D.
  const unsigned shape_kind = in.pick(12);  // 9: scalar, 10: null, 11: 2-D
  hsize_t dims[2] = {16 + static_cast<hsize_t>(in.u8()), static_cast<hsize_t>(1 + in.pick(3))};
  if (in.one_in(16)) dims[0] = in.one_in(2) ? 0 : static_cast<hsize_t>(in.u16()) + 256;
  const hsize_t unlimited[2] = {H5S_UNLIMITED, H5S_UNLIMITED};
  const bool chunked = in.one_in(4);
  const int rank = shape_kind == 11 ? 2 : 1;
  h5::Dataspace space(shape_kind == 9    ? H5Screate(H5S_SCALAR)
                      : shape_kind == 10 ? H5Screate(H5S_NULL)
                      : H5Screate_simple(rank, dims,
                                         chunked && in.one_in(2) ? unlimited : nullptr));
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (chunked && shape_kind != 9 && shape_kind != 10) {
    hsize_t chunk[2] = {1 + static_cast<hsize_t>(in.pick(16)), 1};
    H5Pset_chunk(dcpl, rank, chunk);
    if (in.one_in(2)) H5Pset_shuffle(dcpl);
    if (in.one_in(2)) H5Pset_deflate(dcpl, 1);
    if (in.one_in(4)) H5Pset_fletcher32(dcpl);
  } else if (in.one_in(8)) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  if (in.one_in(8)) {  // a fill value, and maybe no data ever written
    std::vector<unsigned char> fill(esize);
    in.fill(fill.data(), fill.size());
    H5Pset_fill_value(dcpl, type, fill.data());
  }
  h5::Dataset dset(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  if (!dset.valid()) return;  // a combination HDF5 refuses: no dataset
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n > 0 && !in.one_in(16)) {
    std::vector<unsigned char> bytes(static_cast<size_t>(n) * esize);
    if (in.one_in(2)) {
      // Small ids (below 256), as a real file holds, in the type's byte order.
      const bool be = H5Tget_order(type) == H5T_ORDER_BE;
      for (size_t i = 0; i < bytes.size(); i += esize) bytes[i + (be ? esize - 1 : 0)] = in.u8();
    } else {
      in.fill(bytes.data(), bytes.size());
    }
    H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
  }
  switch (in.pick(4)) {
    case 1: write_vocab_attr(in, file); break;
    case 2: write_vocab_attr(in, dset); break;
    case 3: write_vocab_attr(in, file); write_vocab_attr(in, dset); break;
    default: break;
  }
}

}  // namespace

void fuzz_tokens(const uint8_t* data, size_t size) {
  static const unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const char* env = std::getenv("MESHLM_FUZZ_RAW_HDF5");
  const bool raw_hdf5 = env && std::string(env) == "1";
  const bool as_is = size >= 8 && (std::memcmp(data, io::kRawTokensMagic, 8) == 0 ||
                                   (raw_hdf5 && std::memcmp(data, kHdf5Signature, 8) == 0));
  std::string path;
  ByteReader in(data, size);
  if (as_is) {
    path = write_scratch_file("tokens.bin", data, size);
  } else {
    path = scratch_file("tokens.h5");
    build_hdf5(in, path);
  }
  try {
    io::TokenReader r = io::TokenReader::open(path);
    const uint64_t n = r.size();
    if (r.bytes_per_token() != 2 && r.bytes_per_token() != 4) {
      std::fprintf(stderr, "opened with %d bytes per token\n", r.bytes_per_token());
      std::abort();
    }
    std::vector<int32_t> ids(std::min<uint64_t>(n, 4096));
    r.read(0, ids.size(), ids.data());
    if (n > ids.size()) r.read(n - ids.size(), ids.size(), ids.data());
    // A loader over the file: windows of at most 8 tokens, in order or shuffled.
    if (n >= 2) {
      const int T = static_cast<int>(std::min<uint64_t>(n - 1, 1 + in.pick(8)));
      const int64_t attr = r.vocab_size_attr();
      const int vocab = attr > 0 && attr < (1 << 30) ? static_cast<int>(attr) : 1 << 30;
      io::BatchLoader loader(r, 2, T, in.u8() & 1, in.u64(), vocab);
      std::vector<int32_t> inputs(2 * T), targets(2 * T);
      loader.next(inputs.data(), targets.data());
      loader.next(inputs.data(), targets.data());
    }
    report("accepted");
  } catch (const meshlm::Error& e) {
    report(e.what());
  }
}

}  // namespace meshlm::fuzz

MESHLM_FUZZ_ENTRY(meshlm::fuzz::fuzz_tokens)
