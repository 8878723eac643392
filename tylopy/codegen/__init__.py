"""IR to LLVM (llvmlite) to PTX, and the ptxas report. Knows nothing of any particular kernel."""
