#include "io/checkpoint_file.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "core/error.h"
#include "io/h5.h"
#include "io/hash.h"

namespace meshlm::io::ckpt {

std::string params_path(const std::string& name) { return "params/" + name; }

std::string lora_path(const std::string& name) {
  for (const char* end : {".lora_A", ".lora_B"}) {
    const std::string e(end);
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
      return "lora/" + name.substr(0, name.size() - e.size()) + "/" + e.back();
  }
  throw RankError("'" + name + "' is not the name of a LoRA adapter (<matrix>.lora_A or .lora_B)",
                  MESHLM_HERE);
}

std::string optimizer_path(const std::string& name, char moment) {
  return "optimizer/" + name + "/" + moment;
}

std::string file_name_of_step(int64_t step) { return fmt::format("step_{:08d}.h5", step); }

uint64_t float_checksum(const float* data, size_t n) { return xxh3_64(data, n * sizeof(float)); }

namespace {

// Where the file holds the dataset's logical content byte for byte: the
// absolute offset of a contiguous, allocated, unfiltered little-endian
// float32 dataset of `bytes` bytes in a file of the default (sec2) driver;
// nullopt for any other storage, which HDF5 must read (and convert).
std::optional<uint64_t> stored_as_content(hid_t dset, uint64_t bytes) {
  if constexpr (std::endian::native != std::endian::little) return std::nullopt;
  h5::Datatype stored(H5Dget_type(dset));
  if (H5Tequal(stored, H5T_IEEE_F32LE) <= 0) return std::nullopt;
  h5::PropList dcpl(H5Dget_create_plist(dset));
  if (!dcpl.valid() || H5Pget_layout(dcpl) != H5D_CONTIGUOUS || H5Pget_external_count(dcpl) != 0 ||
      H5Pget_nfilters(dcpl) != 0)
    return std::nullopt;
  h5::File file(H5Iget_file_id(dset));
  h5::PropList fapl(H5Fget_access_plist(file));
  if (!fapl.valid() || H5Pget_driver(fapl) != H5FD_SEC2) return std::nullopt;
  if (H5Dget_storage_size(dset) != bytes) return std::nullopt;
  const haddr_t at = H5Dget_offset(dset);  // from the file's first byte, user block included
  if (at == HADDR_UNDEF) return std::nullopt;
  return static_cast<uint64_t>(at);
}

}  // namespace

uint64_t dataset_checksum(hid_t dset, hid_t dxpl,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
  h5::check_type(dset, H5T_NATIVE_FLOAT);
  {
    h5::Datatype stored(H5Dget_type(dset));
    if (H5Tget_class(stored) != H5T_FLOAT || H5Tget_size(stored) != sizeof(float))
      h5::fail(dset, h5::object_name(dset), "is " + h5::type_name(stored) + ", not float32");
  }
  const std::vector<hsize_t> dims = h5::shape(dset);
  uint64_t total = 1, row = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    total *= dims[d];
    if (d > 0) row *= dims[d];
  }
  Xxh3_64 h;
  if (total == 0) return h.value();
  // Stored as its content: the file's bytes hashed as read (pread into a
  // buffer the cache keeps, no HDF5 selection or copy per block).
  if (const std::optional<uint64_t> at = stored_as_content(dset, total * sizeof(float))) {
    const std::string path = h5::file_name(dset);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      h5::fail(dset, h5::object_name(dset), "cannot open '" + path + "': " + std::strerror(errno));
    constexpr size_t kPiece = size_t{1} << 20;
    const size_t bytes = static_cast<size_t>(total) * sizeof(float), report = kReadBlockBytes;
    std::unique_ptr<char[]> buf(new char[kPiece]);
    size_t done = 0, reported = 0;
    while (done < bytes) {
      const ssize_t got = ::pread(fd, buf.get(), std::min(kPiece, bytes - done),
                                  static_cast<off_t>(*at + done));
      if (got <= 0) {
        const std::string why = got < 0 ? std::strerror(errno) : "the file ends first";
        ::close(fd);
        h5::fail(dset, h5::object_name(dset),
                 fmt::format("cannot read bytes [{}, {}) of '{}': {}", *at + done, *at + bytes,
                             path, why));
      }
      h.update(buf.get(), static_cast<size_t>(got));
      done += static_cast<size_t>(got);
      if (progress && (done - reported >= report || done == bytes)) {
        progress(done / sizeof(float), total);
        reported = done;
      }
    }
    ::close(fd);
    return h.value();
  }
  const hsize_t rows = dims.empty() ? 1 : dims[0];
  const hsize_t per_block =
      std::max<hsize_t>(1, std::min<hsize_t>(rows, kReadBlockBytes / sizeof(float) / row));
  // Not zeroed: every block is read before it is hashed.
  std::unique_ptr<float[]> buf(new float[static_cast<size_t>(per_block * row)]);
  const std::string name = h5::object_name(dset);
  h5::Dataspace fspace(H5Dget_space(dset));
  for (hsize_t r0 = 0; r0 < rows; r0 += per_block) {
    const hsize_t n = std::min(per_block, rows - r0);
    if (dims.empty()) {
      h5::check(H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl, buf.get()), dset, name,
                "cannot read dataset");
    } else {
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      start[0] = r0;
      count[0] = n;
      h5::check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                    nullptr),
                dset, name, "cannot select rows");
      const hsize_t len = n * row;
      h5::Dataspace mspace(H5Screate_simple(1, &len, nullptr));
      h5::check(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, buf.get()), dset, name,
                fmt::format("cannot read rows [{}, {})", r0, r0 + n));
    }
    h.update(buf.get(), static_cast<size_t>(n * row) * sizeof(float));
    if (progress) progress((r0 + n) * row, total);
  }
  return h.value();
}

namespace {
herr_t collect(hid_t group, const char* name, const H5L_info_t*, void* op) {
  auto& out = *static_cast<std::pair<std::string, std::vector<std::string>*>*>(op);
  H5O_info_t info{};
  if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
  if (info.type == H5O_TYPE_DATASET) out.second->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_datasets(hid_t file) {
  std::vector<std::string> out;
  std::pair<std::string, std::vector<std::string>*> op{"", &out};
  h5::check(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect, &op), file, "/",
            "cannot list the datasets");
  return out;
}

h5::Group write_identity(hid_t file, const ModelSizes& sizes, const std::string& created,
                         const std::string& config, const std::string& finetune_mode) {
  auto model_attrs = [&](hid_t obj) {
    h5::write_scalar_attr<int64_t>(obj, "format_version", kFormatVersion);
    h5::write_scalar_attr<int64_t>(obj, "n_layer", sizes.n_layer);
    h5::write_scalar_attr<int64_t>(obj, "n_head", sizes.n_head);
    h5::write_scalar_attr<int64_t>(obj, "n_embd", sizes.n_embd);
    h5::write_scalar_attr<int64_t>(obj, "vocab_size", sizes.vocab_size);
    h5::write_scalar_attr<int64_t>(obj, "max_seq_len", sizes.max_seq_len);
  };
  model_attrs(file);
  h5::Group meta = h5::require_group(file, "meta");
  model_attrs(meta);
  h5::write_string_attr(meta, "kind", kKind);
  h5::write_string_attr(meta, "meshlm_version", MESHLM_VERSION);
  h5::write_string_attr(meta, "created", created);
  h5::write_string_attr(meta, "config", config);
  h5::write_string_attr(meta, "finetune_mode", finetune_mode);
  return meta;
}

bool is_checkpoint_file(const std::string& path) {
  try {
    if (!h5::is_hdf5_file(path)) return false;
    h5::File f = h5::open_file(path);
    if (!h5::exists(f, "meta")) return false;
    h5::Group meta(H5Gopen2(f, "meta", H5P_DEFAULT));
    if (!meta.valid() || !h5::has_attr(meta, "kind")) return false;
    return h5::read_string_attr(meta, "kind") == kKind;
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------
// Parallel access
// ---------------------------------------------------------------------------

namespace {

h5::PropList mpio_access(MPI_Comm comm, const std::string& path) {
  h5::PropList fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid() || H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0)
    throw RankError(path + ": cannot set up MPI-IO access (HDF5: " + h5::last_error() + ")",
                    MESHLM_HERE);
  // Metadata read by every rank is read once and broadcast; written
  // collectively.
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  // The 1.8 format: attributes beyond the object header's 64 KiB (one
  // checksum per dataset on /meta/checksums) go to dense storage.
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  return fapl;
}

h5::PropList transfer(bool collective) {
  h5::PropList dxpl(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  return dxpl;
}

size_t box_numel(const Box& b) {
  size_t n = 1;
  for (hsize_t c : b.count) n *= static_cast<size_t>(c);
  return n;
}

// The file and memory selections of `boxes` (the memory side contiguous).
std::pair<h5::Dataspace, h5::Dataspace> selections(hid_t dset, const std::vector<Box>& boxes,
                                                   const std::string& name) {
  h5::Dataspace fspace(H5Dget_space(dset));
  hsize_t n = 0;
  if (boxes.empty()) {
    H5Sselect_none(fspace);
  } else {
    bool first = true;
    for (const Box& b : boxes) {
      const hsize_t k = box_numel(b);
      if (k == 0) continue;
      n += k;
      h5::check(H5Sselect_hyperslab(fspace, first ? H5S_SELECT_SET : H5S_SELECT_OR,
                                    b.start.data(), nullptr, b.count.data(), nullptr),
                dset, name, "cannot select a part");
      first = false;
    }
    if (first) H5Sselect_none(fspace);
  }
  const hsize_t len = std::max<hsize_t>(n, 1);
  h5::Dataspace mspace(H5Screate_simple(1, &len, nullptr));
  if (n == 0) H5Sselect_none(mspace);
  return {std::move(fspace), std::move(mspace)};
}

}  // namespace

h5::File create_parallel(const std::string& path, MPI_Comm comm) {
  h5::PropList fapl = mpio_access(comm, path);
  return h5::create_file(path, fapl);
}

h5::File open_parallel(const std::string& path, MPI_Comm comm, bool writable) {
  h5::PropList fapl = mpio_access(comm, path);
  return h5::open_file(path, writable, fapl);
}

h5::Dataset create_tensor(hid_t file, const std::string& name, const std::vector<hsize_t>& dims) {
  h5::Dataspace space(dims.empty() ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                      nullptr));
  h5::PropList lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  return h5::Dataset(h5::check(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl,
                                          H5P_DEFAULT),
                               file, name, "cannot create dataset"));
}

void write_boxes(hid_t dset, const std::vector<Box>& boxes, const float* data, bool collective) {
  const std::string name = h5::object_name(dset);
  auto [fspace, mspace] = selections(dset, boxes, name);
  h5::PropList dxpl = transfer(collective);
  static const float kNothing = 0;
  h5::check(H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data ? data : &kNothing), dset,
            name, "cannot write dataset");
}

namespace {

// Offset of the box's first element in the row-major order of `dims`, and
// whether its elements are one run there (a contiguous range of the file):
// whole in every dimension after the first it cuts, a single index in every
// dimension before it.
std::pair<hsize_t, bool> linear_start(const Box& b, const std::vector<hsize_t>& dims) {
  hsize_t start = 0;
  for (size_t d = 0; d < dims.size(); ++d) start = start * dims[d] + b.start[d];
  // The last dimension the box cuts; none: the whole tensor.
  size_t cut = 0;
  for (size_t d = dims.size(); d-- > 0;)
    if (b.count[d] != dims[d]) {
      cut = d;
      break;
    }
  bool contiguous = true;
  for (size_t d = 0; d < cut; ++d) contiguous = contiguous && b.count[d] == 1;
  return {start, contiguous};
}

}  // namespace

void write_boxes_in_blocks(hid_t dset, const std::vector<Box>& boxes, const float* data,
                           const std::function<void()>& between, bool collective) {
  write_boxes_in_blocks(dset, boxes, [data](size_t offset, size_t) { return data + offset; },
                        between, collective);
}

void write_boxes_in_blocks(hid_t dset, const std::vector<Box>& boxes, const FloatSource& source,
                           const std::function<void()>& between, bool collective) {
  const std::vector<hsize_t> dims = h5::shape(dset);
  auto numel = [](const std::vector<Box>& bs) {
    size_t n = 0;
    for (const Box& b : bs) n += box_numel(b);
    return n;
  };
  if (dims.empty()) {
    if (collective || !boxes.empty())
      write_boxes(dset, boxes, boxes.empty() ? nullptr : source(0, numel(boxes)), collective);
    return;
  }
  hsize_t row = 1;
  for (size_t d = 1; d < dims.size(); ++d) row *= dims[d];
  const hsize_t rows = dims[0];
  const hsize_t per_block =
      std::max<hsize_t>(1, std::min<hsize_t>(rows, kWriteBlockBytes / sizeof(float) / std::max<hsize_t>(row, 1)));
  // The boxes of the rows [r0, r1) and where their elements start in `data`
  // (the union's elements are in row-major order, so those of rows < r0
  // come first).
  auto rows_of = [&](const std::vector<Box>& from, hsize_t r0, hsize_t r1, size_t& offset) {
    std::vector<Box> part;
    offset = 0;
    for (const Box& b : from) {
      hsize_t box_row = 1;
      for (size_t d = 1; d < b.count.size(); ++d) box_row *= b.count[d];
      const hsize_t lo = std::max(b.start[0], r0), hi = std::min(b.start[0] + b.count[0], r1);
      const hsize_t before = std::min(b.count[0], r0 > b.start[0] ? r0 - b.start[0] : 0);
      offset += static_cast<size_t>(before * box_row);
      if (lo >= hi) continue;
      Box x = b;
      x.start[0] = lo;
      x.count[0] = hi - lo;
      part.push_back(std::move(x));
    }
    return part;
  };
  if (collective) {
    // Every rank makes the same calls, a block of the whole tensor's rows each.
    for (hsize_t r0 = 0; r0 < std::max<hsize_t>(rows, 1); r0 += per_block) {
      size_t offset = 0;
      const std::vector<Box> part = rows_of(boxes, r0, std::min(rows, r0 + per_block), offset);
      write_boxes(dset, part, part.empty() ? nullptr : source(offset, numel(part)),
                  /*collective=*/true);
      if (between) between();
    }
    return;
  }
  // Independent: each box alone, a block of its own rows at a time.
  size_t at = 0;
  hsize_t previous_end = 0;
  const std::string name = h5::object_name(dset);
  for (const Box& b : boxes) {
    const auto [start, contiguous] = linear_start(b, dims);
    const size_t n = box_numel(b);
    MESHLM_CHECK(contiguous && start >= previous_end,
                 "independent checkpoint writes take contiguous boxes in the file's order (" +
                     name + ")");
    previous_end = start + n;
    if (n == 0) continue;
    const std::vector<Box> one{b};
    for (hsize_t r0 = b.start[0]; r0 < b.start[0] + b.count[0]; r0 += per_block) {
      size_t offset = 0;
      const std::vector<Box> part =
          rows_of(one, r0, std::min(b.start[0] + b.count[0], r0 + per_block), offset);
      write_boxes(dset, part, source(at + offset, numel(part)), /*collective=*/false);
      if (between) between();
    }
    at += n;
  }
}

void read_boxes(hid_t dset, const std::vector<Box>& boxes, float* data, bool collective) {
  const std::string name = h5::object_name(dset);
  auto [fspace, mspace] = selections(dset, boxes, name);
  h5::PropList dxpl = transfer(collective);
  float nothing = 0;
  h5::check(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data ? data : &nothing), dset,
            name, "cannot read dataset");
}

}  // namespace meshlm::io::ckpt
