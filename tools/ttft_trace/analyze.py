"""Each hop's median time from tools/ttft_trace/run.sh's merged timestamps (argv[1]: `monotonic_ns label` lines of
every process, sorted), over the requests after the first five; a request starts at `g_http`."""
import collections
import sys


def requests(path: str) -> list[dict[str, int]]:
    """Each request's first time at each label, in order."""
    found: list[dict[str, int]] = []
    for line in open(path):
        nanoseconds, label = line.split()
        if label == "g_http":
            found.append({})
        if found and label not in found[-1]:
            found[-1][label] = int(nanoseconds)
    return found


def main() -> None:
    since_start, hop = collections.defaultdict(list), collections.defaultdict(list)
    for request in requests(sys.argv[1])[5:]:
        start = previous = request["g_http"]
        for label, nanoseconds in request.items():
            since_start[label].append((nanoseconds - start) / 1e6)
            hop[label].append((nanoseconds - previous) / 1e6)
            previous = nanoseconds
            if label == "g_first":
                break
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    for label in sorted(since_start, key=lambda label: median(since_start[label])):
        print(f"{label:12s} at {median(since_start[label]):7.2f} ms  (+{median(hop[label]):.2f})  n={len(hop[label])}")


if __name__ == "__main__":
    main()
