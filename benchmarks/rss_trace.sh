#!/bin/sh
# Sample a process's memory every few seconds: UTC time, VmRSS, RssAnon, RssFile (MiB).
#   benchmarks/rss_trace.sh PID [SECONDS] > trace.tsv
pid=$1; every=${2:-5}
echo "utc	rss_mib	anon_mib	file_mib"
while [ -r /proc/$pid/status ]; do
  awk -v t="$(date -u +%H:%M:%S)" '/^VmRSS/{r=$2} /^RssAnon/{a=$2} /^RssFile/{f=$2}
       END{printf "%s\t%d\t%d\t%d\n", t, r/1024, a/1024, f/1024}' /proc/$pid/status
  sleep "$every"
done
