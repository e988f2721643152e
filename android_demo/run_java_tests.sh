#!/usr/bin/env bash
# Compile the plain-Java core library (android_demo/core) with javac 17 and run its JUnit4 tests.
# Needs no Gradle, Maven or Android SDK: only a JDK 17 and Debian's junit4 package
# (apt-get install -y openjdk-17-jdk-headless junit4).
#
# usage: run_java_tests.sh [test]        compile, then run every *Test class (default)
#        run_java_tests.sh build         compile only
#        run_java_tests.sh cli ARGS...   compile, then run com.omnidraft.core.Cli (dump/rewrite/verify)
# env:   OMNIDRAFT_JAVA_BUILD  output folder (default core/build/plain-java)
#        JUNIT_JAR, HAMCREST_JAR  (default /usr/share/java/junit4.jar, hamcrest-core.jar)
#        OMNIDRAFT_TRACES   golden traces folder (default tests/golden/traces)
#        OMNIDRAFT_VECTORS  tokenizer vectors folder (default tests/golden/tokenizer_vectors)
#        OMNIDRAFT_TOKENIZERS  folder of NAME/tokenizer.{json,model} (unset: those checks are skipped)
#        OMNIDRAFT_MAPS     folder of DRAFTER--TARGET.vocab_map.bin for the tiny-pair traces
#        OMNIDRAFT_MULTI_BUNDLE  the multi-target bundle the multi-target trace replays from
#        (tests/e2e/test_android_java.py writes TOKENIZERS and MAPS from the Python tokenizers and
#        mappers, and passes the multi-target bundle the tests export)
# exit:  3 when javac or JUnit4 is missing.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$HERE/core/src"
BUILD="${OMNIDRAFT_JAVA_BUILD:-$HERE/core/build/plain-java}"
JUNIT="${JUNIT_JAR:-/usr/share/java/junit4.jar}"
HAMCREST="${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}"
GOLDEN="$HERE/../tests/golden/ngram_v1.bin"
TRACES="${OMNIDRAFT_TRACES:-$HERE/../tests/golden/traces}"
VECTORS="${OMNIDRAFT_VECTORS:-$HERE/../tests/golden/tokenizer_vectors}"

command -v javac >/dev/null || { echo "javac not found: apt-get install -y openjdk-17-jdk-headless" >&2; exit 3; }
[ -f "$JUNIT" ] || { echo "JUnit4 not found at $JUNIT: apt-get install -y junit4" >&2; exit 3; }

compile() {
  local stamp="$BUILD/.stamp"
  if [ -f "$stamp" ] && [ -z "$(find "$SRC" -name '*.java' -newer "$stamp")" ]; then
    return 0
  fi
  rm -rf "$BUILD/classes"
  mkdir -p "$BUILD/classes"
  # One javac run for library and tests (one JVM start); every lint warning is an error.
  javac --release 17 -Xlint:all -Werror -encoding UTF-8 -d "$BUILD/classes" -cp "$JUNIT" \
    $(find "$SRC/main/java" "$SRC/test/java" -name '*.java' | sort)
  touch "$stamp"
}

compile
case "${1:-test}" in
  build) ;;
  cli)
    shift
    exec java -cp "$BUILD/classes" com.omnidraft.core.Cli "$@" ;;
  test)
    classes=$(cd "$SRC/test/java" && find . -name '*Test.java' | sort | sed 's|^\./||; s|\.java$||; s|/|.|g')
    exec java -Domnidraft.golden="$GOLDEN" -Domnidraft.traces="$TRACES" -Domnidraft.vectors="$VECTORS" \
      -Domnidraft.tokenizers="${OMNIDRAFT_TOKENIZERS:-}" -Domnidraft.maps="${OMNIDRAFT_MAPS:-}" \
      -Domnidraft.multibundle="${OMNIDRAFT_MULTI_BUNDLE:-}" -cp "$BUILD/classes:$JUNIT:$HAMCREST" \
      org.junit.runner.JUnitCore $classes ;;
  *)
    echo "usage: $0 [test | build | cli ARGS...]" >&2; exit 2 ;;
esac
