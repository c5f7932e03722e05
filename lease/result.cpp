#include "leasehold/lease/result.hpp"

#include <cerrno>
#include <cstring>

namespace leasehold {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::ok: return "ok";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::not_found: return "not_found";
    case Errc::permission_denied: return "permission_denied";
    case Errc::exists: return "exists";
    case Errc::io_error: return "io_error";
    case Errc::corrupt: return "corrupt";
    case Errc::unsupported: return "unsupported";
    case Errc::busy: return "busy";
    case Errc::timeout: return "timeout";
    case Errc::refused: return "refused";
  }
  return "io_error";
}

Errc errc_of_errno(int err) noexcept {
  switch (err < 0 ? -err : err) {
    case 0: return Errc::ok;
    case ENOENT:
    case ENOTDIR:
    case ESRCH: return Errc::not_found;
    case EACCES:
    case EPERM:
    case EROFS: return Errc::permission_denied;
    case EEXIST: return Errc::exists;
    case EINVAL:
    case ERANGE:
    case ENAMETOOLONG:
    case EBADF: return Errc::invalid_argument;
    case EAGAIN:
    case EBUSY:
    case EINTR: return Errc::busy;
    case ETIMEDOUT: return Errc::timeout;
    case ENOSYS:
    case EOPNOTSUPP:
    case EAFNOSUPPORT: return Errc::unsupported;
    default: return Errc::io_error;
  }
}

Status Status::from_errno(int err, std::string_view what) {
  LEASEHOLD_ASSERT(err != 0);
  const int e = err < 0 ? -err : err;
  return Status(errc_of_errno(e), std::string(what) + ": " + std::strerror(e));
}

}  // namespace leasehold
