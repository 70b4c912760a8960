"""The kit: what the kernel families share, beneath them. The families import it and the stages call it; it imports
neither (only emitter.errors, emitter.dtypes and the like beside it), so the import graph runs one way: stages above
families above the kit.

arena.py          DeviceArena: one measurement's device allocations, random fills, poison fills
enums.py          Arch, Activation, SplitK, Shape3, AUTO: the vocabulary the CUTLASS families share
failures.py       what running a kernel can fail with (CannotImplement, LaunchFailed, CudaFault, ...)
hostdata.py       host-side storage codecs of every dtype (encode, decode, poison values)
launcher.py       launching a cubin through the driver with Params by value (PackedParams, DriverKernel)
library.py        LibraryPieces (what a family adds to an exported library), LibraryError, the C API's shared codes
prepare.py        a launch through a host shim: query, Params, workspace
shim.py           the host shim's ctypes ABI (templates/common/emitter_abi.h)
torch_interop.py  torch beside emitter's buffers: availability, zero-copy views of device pointers
workspace.py      the profiler's side of the library's per-call workspace reset
"""
