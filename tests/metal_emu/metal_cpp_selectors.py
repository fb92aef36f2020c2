"""Which Objective-C messages metal-cpp's headers can send through a given class.

Used by tests/test_metal_emu_selftest.py to check the fake Metal runtime against the real
metal-cpp: every selector those headers send to a supported class must be looked up through
the right class (implemented, or refused with the "[-Class sel] not implemented" message),
and every selector the fake implements must be one that metal-cpp really sends (no typos).
"""
from __future__ import annotations

import os
import re

# The C++ classes the fake runtime implements, with their Objective-C class names.
SUPPORTED = {
    "NS::AutoreleasePool": "NSAutoreleasePool",
    "NS::String": "NSString",
    "NS::Error": "NSError",
    "NS::Array": "NSArray",
    "NS::Dictionary": "NSDictionary",
    "NS::Number": "NSNumber",
    "NS::URL": "NSURL",
    "MTL::Device": "MTLDevice",
    "MTL::CompileOptions": "MTLCompileOptions",
    "MTL::Library": "MTLLibrary",
    "MTL::Function": "MTLFunction",
    "MTL::ComputePipelineDescriptor": "MTLComputePipelineDescriptor",
    "MTL::ComputePipelineState": "MTLComputePipelineState",
    "MTL::Buffer": "MTLBuffer",
    "MTL::CommandQueue": "MTLCommandQueue",
    "MTL::CommandBuffer": "MTLCommandBuffer",
    "MTL::ComputeCommandEncoder": "MTLComputeCommandEncoder",
    "MTL::BlitCommandEncoder": "MTLBlitCommandEncoder",
}


def _headers(root: str):
    for sub in ("Foundation", "Metal"):
        d = os.path.join(root, sub)
        for name in sorted(os.listdir(d)):
            if name.endswith(".hpp"):
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    yield f.read()


def parse(root: str):
    """Returns (instance, class_methods, bases): selectors per C++ class sent to `this`,
    selectors per Objective-C class name sent to the class object, and C++ base classes."""
    texts = list(_headers(root))
    sel_names = {}
    for t in texts:
        for m in re.finditer(r"_(?:NS|MTL)_PRIVATE_DEF_SEL\(\s*(\w+)\s*,\s*\"([^\"]+)\"\s*\)", t):
            sel_names[m.group(1)] = m.group(2)
    instance: dict[str, set[str]] = {}
    class_methods: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for t in texts:
        ns = "MTL" if "namespace MTL" in t else "NS"
        for m in re.finditer(r"class\s+(\w+)\s*:\s*public\s+(?:NS::)?(Referencing|Copying|SecureCoding)\s*<\s*\w+\s*(?:,\s*([\w:]+)\s*)?>", t):
            base = m.group(3) or "NS::Object"
            if "::" not in base:
                base = "%s::%s" % (ns, base)
            cls = "%s::%s" % (ns, m.group(1))
            bases[cls] = [base]
            if m.group(2) == "Copying":  # NS::Copying<T>::copy()
                instance.setdefault(cls, set()).add("copy")
        # method definitions: _MTL_INLINE ret MTL::Class::method(...) { body }
        for m in re.finditer(r"_(?:NS|MTL)_INLINE\s[^{;]*?\b((?:NS|MTL)::\w+)::~?\w+\s*\([^;{]*\)\s*(?:const\s*)?\{", t):
            cls = m.group(1)
            depth, j = 0, m.end() - 1
            for j in range(m.end() - 1, len(t)):
                if t[j] == "{":
                    depth += 1
                elif t[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
            body = t[m.end():j]
            for s in re.finditer(r"sendMessage(?:Safe)?\s*<[^()]*?>\s*\(\s*(this|_(?:NS|MTL)_PRIVATE_CLS\(\s*(\w+)\s*\))\s*,\s*"
                                 r"_(?:NS|MTL)_PRIVATE_SEL\(\s*(\w+)\s*\)", body):
                name = sel_names.get(s.group(3))
                if not name:
                    continue
                if s.group(1) == "this":
                    instance.setdefault(cls, set()).add(name)
                else:
                    class_methods.setdefault(s.group(2), set()).add(name)
            for s in re.finditer(r"alloc\s*<[^()]*>\s*\(\s*_(?:NS|MTL)_PRIVATE_CLS\(\s*(\w+)\s*\)", body):
                class_methods.setdefault(s.group(1), set()).add("alloc")
            if re.search(r"\binit\s*<[^()]*>\s*\(\s*\)", body):
                instance.setdefault(cls, set()).add("init")
    # NS::Object's own methods, Referencing's retain/release/autorelease/retainCount, and the
    # two that NS::Object::sendMessageSafe sends to any receiver
    obj = instance.setdefault("NS::Object", set())
    obj.update({"retain", "release", "autorelease", "retainCount", "respondsToSelector:", "methodSignatureForSelector:"})
    return instance, class_methods, bases


def sendable(root: str) -> dict[str, set[str]]:
    """Objective-C class name -> {"-sel", "+sel"} that metal-cpp can send to it."""
    instance, class_methods, bases = parse(root)

    def chain(cls):
        seen = []
        while cls and cls not in seen:
            seen.append(cls)
            cls = (bases.get(cls) or [None])[0] if cls != "NS::Object" else None
        if "NS::Object" not in seen:
            seen.append("NS::Object")
        return seen

    out = {}
    for cxx, objc in SUPPORTED.items():
        sels = set()
        for c in chain(cxx):
            sels |= {"-" + s for s in instance.get(c, ())}
        sels |= {"+" + s for s in class_methods.get(objc, ())}
        out[objc] = sels
    return out
