#include "commands.h"

namespace osprey::cli {

int& exit_code() {
  static int code = 0;
  return code;
}

}  // namespace osprey::cli
