#include "kv/h5_check.h"

#include <mutex>

namespace tandem::kv {

void H5Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

void h5_quiet() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

std::string h5_error() {
  std::string innermost;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &innermost);
  H5Eclear2(H5E_DEFAULT);
  return innermost.empty() ? "HDF5 error" : innermost;
}

}  // namespace tandem::kv
