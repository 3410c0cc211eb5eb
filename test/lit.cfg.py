# lit configuration for the dloss IR tests.
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "DLOSS"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.dloss_obj_root, "test")
# runtime/ holds GoogleTest sources, run by ctest directly.
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "runtime", "numeric", "e2e", "Inputs"]

config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"
config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%dloss_src", config.dloss_src_root))
config.substitutions.append(("%dloss_obj", config.dloss_obj_root))
# llvm-tblgen's include flags for MLIR's .td files (the ODS tests).
config.substitutions.append(("%mlir_td_includes", " ".join(
    "-I " + d for d in config.mlir_include_dirs.split(";") if d)))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

# LLVM's test tools (FileCheck, not, count) come from the installed LLVM.
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.dloss_tools_dir, append_path=True)

tool_dirs = [config.dloss_tools_dir, config.llvm_tools_dir]
tools = ["dloss-opt", "dlossc", "not", "count", "llvm-tblgen"]
llvm_config.add_tool_substitutions(tools, tool_dirs)
