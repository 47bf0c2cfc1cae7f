#include "loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace osprey {

namespace {

// Closes the descriptor on every path out of open().
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

Expected<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  FdGuard guard{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (guard.fd < 0) {
    const int err = errno;
    std::string msg = "cannot open '" + path + "': " + std::strerror(err);
    if (err == ENOENT) return not_found(msg);
    return invalid_argument(msg);
  }
  struct stat st {};
  if (::fstat(guard.fd, &st) != 0) {
    return invalid_argument("cannot stat '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("'" + path + "' is not a regular file");
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  if (st.st_size == 0) {
    static const uint8_t kEmpty = 0;
    f->data_ = &kEmpty;
    return f;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, guard.fd, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("cannot mmap '" + path + "' (" + std::to_string(size) +
                              " bytes): " + std::strerror(errno));
  }
  f->map_ = p;
  f->size_ = size;
  f->data_ = static_cast<const uint8_t*>(p);
  return f;
}

}  // namespace osprey
