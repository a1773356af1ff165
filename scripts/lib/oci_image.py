"""An OCI image layout read from its own blobs, for scripts/check-image.sh and
scripts/check-agent-image.sh: the manifest and configuration of the one image tagged with a
name, and the list of what differs from what a check expects."""

import json
import os
import sys


def load(layout, ref_name):
    """(manifest, config) of the one manifest in `layout` tagged `ref_name`; exits otherwise."""

    def blob(digest):
        algo, hexd = digest.split(":", 1)
        with open(os.path.join(layout, "blobs", algo, hexd), "rb") as f:
            return json.load(f)

    with open(os.path.join(layout, "index.json"), "rb") as f:
        index = json.load(f)
    refs = [m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref_name]
    if len(refs) != 1:
        sys.exit(f"the layout has {len(refs)} manifests tagged {ref_name}, not 1")
    manifest = blob(refs[0]["digest"])
    return manifest, blob(manifest["config"]["digest"])


class Expectations:
    """The differences found so far between an image's configuration and a check's wants."""

    def __init__(self):
        self.errors = []

    def want(self, what, got, expected):
        """Notes `what` unless `got` is `expected`."""
        if got != expected:
            self.errors.append(f"{what} is {got!r}, not {expected!r}")

    def exit_if_any(self):
        """Exits with every difference, one a line, if there is one."""
        if self.errors:
            sys.exit("\n".join(self.errors))
