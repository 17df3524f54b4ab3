/* Force-included into every mlx-c C++ file when the C++ library lacks <format> (libstdc++
 * before GCC 13, e.g. Debian 12). mlx-c uses std::format only to build error messages from
 * "{}" placeholders, so a minimal stand-in that streams each argument into the next "{}" is
 * enough. */
#ifndef ENGINE_MLX_FORMAT_SHIM_H
#define ENGINE_MLX_FORMAT_SHIM_H
#ifdef __cplusplus
#if __has_include(<format>)
#include <format>
#else
#include <sstream>
#include <string>
#include <string_view>

namespace engine_mlx_shim {
inline void format_into(std::ostringstream& out, std::string_view fmt) {
  out << fmt;
}
template <class T, class... Rest>
void format_into(std::ostringstream& out, std::string_view fmt, const T& first,
                 const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << first;
  format_into(out, fmt.substr(at + 2), rest...);
}
}  // namespace engine_mlx_shim

namespace std {
template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  engine_mlx_shim::format_into(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif
#endif
#endif
