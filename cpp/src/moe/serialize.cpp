// serialize.cpp — PackedExperts files: pack once, map forever.
// Layout (little-endian): a 256-byte header, then the sections qweight, scales, zeros, mins, k_perm,
// each at a 4096-byte aligned offset, so that a read-only mmap of the file is the packed buffers.
//   header: magic "MOECPUPK", u32 version (3; 4 for A16 files), u32 header bytes (256), u32 scheme, u32 layout id,
//           i64 E, N, K, group_size, block_n, u32 has_zeros, u32 section count (5),
//           3 x {u64 offset, u64 bytes, u32 crc32, u32 0}, char kernel[40] (what it was packed for),
//           the k_perm section {...}, u8 has_mins, u8 has_codebook, u8 has_k_perm, u8 0,
//           i8 codebook[16], the mins section {...}, u32 crc32 of bytes [0, 252) at offset 252.
//   Version 4 is version 3 with the A16 scheme ids (4 int4_w4a16, 5 int8_w8a16), which older readers refuse.
//   Version 5 is version 4 with the A8 activation block (docs/numerics.md) in the byte after has_k_perm: act_block / 32
//   (1, 2, 4 or 8; 0 per row). Files with activation blocks are written as version 5, the others as before.
//   Read too: version 2 (4 sections, kernel[64] where version 3 has kernel[40] and k_perm, a zero
//   byte for has_k_perm) and version 1 (3 sections, zero bytes where version 2 has mins and codebook).
// Everything read is checked (magic, version, CRCs, layout, shapes against section sizes, the file
// size), and a failure raises ValueError naming what is wrong.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/layout.h"
#include "dispatch/registry.h"
#include "moe/int_forms.h"
#include "moe/split_codes.h"
#include "moe/qword_panels.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'C', 'P', 'U', 'P', 'K'};
constexpr uint32_t kVersion = 5, kHeaderBytes = 256, kLayoutBlocked16 = 1, kSections = 5;
constexpr uint64_t kAlign = 4096;

#pragma pack(push, 1)
struct Section {
  uint64_t offset, bytes;
  uint32_t crc32, reserved;
};
struct Header {
  char magic[8];
  uint32_t version, header_bytes, scheme, layout;
  int64_t E, N, K, group_size, block_n;
  uint32_t has_zeros, sections;
  Section section[3];  // qweight, scales, zeros
  char kernel[40];
  Section k_perm;                  // version 3 (bytes of the kernel name in versions 1 and 2)
  uint8_t has_mins, has_codebook;  // version 2 from here (zero in version 1)
  uint8_t has_k_perm, act_block32;  // version 3 (zero before); version 5: act_block / 32 (zero before)
  int8_t codebook[16];
  Section mins;
  uint32_t header_crc32;
};
#pragma pack(pop)
static_assert(sizeof(Header) == kHeaderBytes, "the file header is 256 bytes");

uint32_t crc32(const uint8_t* p, size_t n) {  // IEEE 802.3, reflected (zlib.crc32)
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

const AlignedBuffer& section_buffer(const PackedExperts& p, int i) {
  return i == 0 ? p.qweight : i == 1 ? p.scales : i == 2 ? p.zeros : i == 3 ? p.mins : p.k_perm;
}
Section& section_of(Header& h, int i) { return i < 3 ? h.section[i] : i == 3 ? h.mins : h.k_perm; }

// Bytes each section must have for these shapes (the same arithmetic packing uses).
std::array<uint64_t, kSections> expected_bytes(const PackedExperts& p) {
  const uint64_t panels = uint64_t(p.num_experts * p.num_blocks());
  const uint64_t groups = panels * uint64_t(p.num_groups()) * 16;
  return {panels * uint64_t(layout::panel_bytes(p.scheme, p.in_features)), p.scheme == Scheme::kBf16 ? 0 : groups * 4, p.has_zeros ? groups : 0,
          p.has_mins ? groups * 4 : 0, p.has_k_perm() ? uint64_t(p.num_experts * p.in_features) * 4 : 0};
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
struct Mapping {  // owns a file mapping; shared by the views into it
  Mapping(void* b, size_t n) : base(b), bytes(n) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(base, bytes); }
  void* base;
  size_t bytes;
};

}  // namespace

void save_packed(const PackedExperts& p, const std::string& path) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = p.act_block ? 5 : p.a16 ? 4 : 3, h.header_bytes = kHeaderBytes, h.scheme = uint32_t(p.run_scheme()), h.layout = kLayoutBlocked16;
  h.E = p.num_experts, h.N = p.out_features, h.K = p.in_features, h.group_size = p.group_size, h.block_n = p.block_n;
  h.has_zeros = p.has_zeros, h.sections = kSections;
  h.has_mins = p.has_mins, h.has_codebook = p.has_codebook, h.has_k_perm = p.has_k_perm();
  h.act_block32 = uint8_t(p.act_block / 32);
  std::memcpy(h.codebook, p.codebook, 16);
  std::snprintf(h.kernel, sizeof h.kernel, "%s", p.kernel ? p.kernel->name : "");
  uint64_t off = align_up(kHeaderBytes);
  // Integer mins are a kernel's form: the file holds the float mins they stand for.
  // Integer and fp16 scales likewise, and split codes.
  const bool form_scales = p.iscale_groups || p.half_scales;
  const AlignedBuffer fmins = p.imin_groups ? float_mins(p) : AlignedBuffer();
  const AlignedBuffer fscales = form_scales ? float_scales(p) : AlignedBuffer();
  // split codes: the int8 panels; qword panels: the standard order
  const AlignedBuffer codes = p.split_bits ? joined_codes(p) : p.qword_panels ? standard_panels(p) : AlignedBuffer();
  const auto buffer = [&](int i) -> const AlignedBuffer& {
    return i == 3 && p.imin_groups ? fmins : i == 1 && form_scales ? fscales
           : i == 0 && (p.split_bits || p.qword_panels) ? codes : section_buffer(p, i);
  };
  for (int i = 0; i < int(kSections); ++i) {
    const AlignedBuffer& b = buffer(i);
    section_of(h, i) = Section{off, b.size(), crc32(b.data(), b.size()), 0};
    off = align_up(off + b.size());
  }
  h.header_crc32 = crc32(reinterpret_cast<const uint8_t*>(&h), 252);
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw ValueError(msg("path = '", path, "' cannot be opened for writing: ", std::strerror(errno)));
  auto write_at = [&](uint64_t at, const void* data, size_t n) {
    if (std::fseek(f.get(), long(at), SEEK_SET) != 0 || (n && std::fwrite(data, 1, n, f.get()) != n))
      throw ValueError(msg("writing '", path, "' failed: ", std::strerror(errno)));
  };
  write_at(0, &h, sizeof h);
  for (int i = 0; i < int(kSections); ++i) write_at(section_of(h, i).offset, buffer(i).data(), section_of(h, i).bytes);
  uint64_t data_end = kHeaderBytes;
  for (int i = 0; i < int(kSections); ++i)
    if (section_of(h, i).bytes) data_end = std::max<uint64_t>(data_end, section_of(h, i).offset + section_of(h, i).bytes);
  const char zero = 0;  // pad the file to the last aligned boundary, past every section's data
  if (off > data_end) write_at(off - 1, &zero, 1);
  if (std::fflush(f.get()) != 0) throw ValueError(msg("writing '", path, "' failed: ", std::strerror(errno)));
}

PackedExperts load_packed(const std::string& path, bool use_mmap, bool verify) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ValueError(msg("path = '", path, "' cannot be opened: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < off_t(kHeaderBytes)) {
    ::close(fd);
    throw ValueError(msg("'", path, "' is not a moe_cpu packed file (", st.st_size, " bytes, shorter than the header)"));
  }
  const size_t size = size_t(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw ValueError(msg("'", path, "' cannot be mapped: ", std::strerror(errno)));
  auto mapping = std::make_shared<Mapping>(base, size);
  const uint8_t* bytes = static_cast<const uint8_t*>(base);
  Header h;
  std::memcpy(&h, bytes, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw ValueError(msg("'", path, "' is not a moe_cpu packed file (bad magic)"));
  if (h.version < 1 || h.version > kVersion)
    throw ValueError(msg("'", path, "' has format version ", h.version, "; this build reads versions 1 to ", kVersion));
  if (crc32(bytes, 252) != h.header_crc32) throw ValueError(msg("'", path, "' is corrupted: header checksum mismatch"));
  if (h.layout != kLayoutBlocked16)
    throw ValueError(msg("'", path, "' was packed for weight layout ", h.layout, " (kernel '",
                         std::string(h.kernel, strnlen(h.kernel, h.version < 3 ? 64 : 40)),
                         "'), which this build cannot run; repack it from the checkpoint"));
  const uint32_t sections = h.version == 1 ? 3 : h.version == 2 ? 4 : kSections;
  if (h.version == 1) h.has_mins = h.has_codebook = 0, h.mins = Section{};  // padding in version 1
  if (h.version < 3) h.has_k_perm = 0, h.k_perm = Section{};                // kernel name bytes before
  if (h.version < 5) h.act_block32 = 0;
  if (h.scheme > uint32_t(h.version >= 4 ? Scheme::kInt8W8A16 : Scheme::kBf16) || h.sections != sections || h.header_bytes != kHeaderBytes)
    throw ValueError(msg("'", path, "' has an invalid header (scheme ", h.scheme, ", ", h.sections, " sections)"));
  PackedExperts p;
  p.scheme = weight_scheme(Scheme(h.scheme)), p.a16 = is_a16_scheme(Scheme(h.scheme));
  p.num_experts = h.E, p.out_features = h.N, p.in_features = h.K, p.group_size = h.group_size, p.block_n = h.block_n;
  p.has_zeros = h.has_zeros != 0;
  p.has_mins = h.has_mins != 0;
  p.has_codebook = h.has_codebook != 0;
  if (p.has_zeros) {
    const int8_t identity[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    p.set_codebook(identity);
  }
  if (p.has_codebook) p.set_codebook(h.codebook);
  const bool gs_ok = p.group_size == -1 || (p.group_size > 0 && (p.scheme == Scheme::kFp8W8A16 || p.in_features % p.group_size == 0));
  if (h.E < 1 || h.N < 1 || h.K < 1 || h.E > (int64_t(1) << 32) || h.N > (int64_t(1) << 32) || h.K > (int64_t(1) << 32) || !gs_ok ||
      (p.scheme == Scheme::kFp8W8A16 && (h.block_n < 1 || h.group_size < 1)) || (p.has_zeros && p.scheme != Scheme::kInt4W4A8) ||
      (p.has_codebook && (p.scheme != Scheme::kInt4W4A8 || p.has_zeros)) || (p.has_mins && !is_int_scheme(p.scheme)) ||
      h.has_mins > 1 || h.has_codebook > 1 || h.has_k_perm > 1 || (h.has_k_perm && !is_int_scheme(p.scheme)))
    throw ValueError(msg("'", path, "' has invalid shapes in its header (E=", h.E, ", N=", h.N, ", K=", h.K,
                         ", group_size=", h.group_size, ", block_n=", h.block_n, ")"));
  auto want = expected_bytes(p);
  if (h.has_k_perm) want[4] = uint64_t(p.num_experts * p.in_features) * 4;
  AlignedBuffer* dst[kSections] = {&p.qweight, &p.scales, &p.zeros, &p.mins, &p.k_perm};
  const char* names[kSections] = {"qweight", "scales", "zeros", "mins", "k_perm"};
  for (int i = 0; i < int(sections); ++i) {
    const Section& s = section_of(h, i);
    if (s.bytes != want[size_t(i)])
      throw ValueError(msg("'", path, "': section ", names[i], " has ", s.bytes, " bytes but the header's shapes need ",
                           want[size_t(i)]));
    if (s.offset % kAlign != 0 || s.offset > size || s.bytes > size - s.offset)
      throw ValueError(msg("'", path, "' is truncated or corrupted: section ", names[i], " [", s.offset, ", +", s.bytes,
                           ") lies outside the ", size, "-byte file"));
    if (verify && crc32(bytes + s.offset, s.bytes) != s.crc32)
      throw ValueError(msg("'", path, "' is corrupted: section ", names[i], " checksum mismatch"));
    if (use_mmap) {
      *dst[i] = AlignedBuffer::view(bytes + s.offset, s.bytes, mapping);
    } else {
      *dst[i] = AlignedBuffer(s.bytes);
      std::memcpy(dst[i]->data(), bytes + s.offset, s.bytes);
    }
  }
  if (p.has_k_perm()) {  // a damaged permutation would read out of bounds: check it as packing does
    const AlignedBuffer perm = std::move(p.k_perm);
    set_k_perm(p, perm.as<int32_t>());
  }
  set_kernel(p, select_kernel(p));  // and the scale / min forms it reads
  if (h.act_block32) {  // checked as packing checks it
    if (h.act_block32 > 8) throw ValueError(msg("'", path, "' has an invalid header (activation block ", 32 * int(h.act_block32), ")"));
    set_act_block(p, 32 * int64_t(h.act_block32));
  }
  return p;
}

}  // namespace moe_cpu
