/* Replaces mlx-c's mlx/c/half.h on targets other than aarch64, where it declares no float16 /
 * bfloat16 types (it relies on ARM's __fp16 and __bf16) and mlx-rs then fails to compile.
 * Force-included before anything else, it claims half.h's include guard.
 *
 * mlx-c only passes these types by pointer, so any 2-byte type has the right ABI:
 *  - C++ (compiling mlx-c): MLX's own half types, so `item<float16_t>()` and
 *    `data<float16_t>()` name exactly the element types MLX stores;
 *  - C (bindgen): plain 16-bit integers; the Rust side (lib.rs) blocklists them and defines
 *    the same shapes bindgen produces on aarch64 macOS, which mlx-rs is written against. */
#ifndef MLX_HALF_H
#define MLX_HALF_H

#define HAS_FLOAT16
#define HAS_BFLOAT16

#ifdef __cplusplus
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
#include <stdint.h>
typedef uint16_t float16_t;
typedef uint16_t bfloat16_t;
#endif

#endif
