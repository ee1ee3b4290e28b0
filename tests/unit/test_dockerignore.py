"""The .dockerignore matcher against moby/patternmatcher's own test table
(github.com/moby/patternmatcher, patternmatcher_test.go and ignorefile_test.go at
5a6d842): the cases are Docker's behaviour, so a port that passes them matches Docker."""

from __future__ import annotations

import pytest

from gpuenv.images.dockerignore import (
    BadPattern,
    Pattern,
    PatternMatcher,
    clean,
    read_ignore_file,
)

# TestMatches: (pattern, path, excluded)
MATCHES = [
    ("**", "file", True),
    ("**", "file/", True),
    ("**/", "file", True),
    ("**/", "file/", True),
    ("**", "/", True),
    ("**/", "/", True),
    ("**", "dir/file", True),
    ("**/", "dir/file", True),
    ("**", "dir/file/", True),
    ("**/", "dir/file/", True),
    ("**/**", "dir/file", True),
    ("**/**", "dir/file/", True),
    ("dir/**", "dir/file", True),
    ("dir/**", "dir/file/", True),
    ("dir/**", "dir/dir2/file", True),
    ("dir/**", "dir/dir2/file/", True),
    ("**/dir", "dir", True),
    ("**/dir", "dir/file", True),
    ("**/dir2/*", "dir/dir2/file", True),
    ("**/dir2/*", "dir/dir2/file/", True),
    ("**/dir2/**", "dir/dir2/dir3/file", True),
    ("**/dir2/**", "dir/dir2/dir3/file/", True),
    ("**file", "file", True),
    ("**file", "dir/file", True),
    ("**/file", "dir/file", True),
    ("**file", "dir/dir/file", True),
    ("**/file", "dir/dir/file", True),
    ("**/file*", "dir/dir/file", True),
    ("**/file*", "dir/dir/file.txt", True),
    ("**/file*txt", "dir/dir/file.txt", True),
    ("**/file*.txt", "dir/dir/file.txt", True),
    ("**/file*.txt*", "dir/dir/file.txt", True),
    ("**/**/*.txt", "dir/dir/file.txt", True),
    ("**/**/*.txt2", "dir/dir/file.txt", False),
    ("**/*.txt", "file.txt", True),
    ("**/**/*.txt", "file.txt", True),
    ("a**/*.txt", "a/file.txt", True),
    ("a**/*.txt", "a/dir/file.txt", True),
    ("a**/*.txt", "a/dir/dir/file.txt", True),
    ("a/*.txt", "a/dir/file.txt", False),
    ("a/*.txt", "a/file.txt", True),
    ("a/*.txt**", "a/file.txt", True),
    ("a[b-d]e", "ae", False),
    ("a[b-d]e", "ace", True),
    ("a[b-d]e", "aae", False),
    ("a[^b-d]e", "aze", True),
    (".*", ".foo", True),
    (".*", "foo", False),
    ("abc.def", "abcdef", False),
    ("abc.def", "abc.def", True),
    ("abc.def", "abcZdef", False),
    ("abc?def", "abcZdef", True),
    ("abc?def", "abcdef", False),
    ("a\\\\", "a\\", True),
    ("**/foo/bar", "foo/bar", True),
    ("**/foo/bar", "dir/foo/bar", True),
    ("**/foo/bar", "dir/dir2/foo/bar", True),
    ("abc/**", "abc", False),
    ("abc/**", "abc/def", True),
    ("abc/**", "abc/def/ghi", True),
    ("**/.foo", ".foo", True),
    ("**/.foo", "bar.foo", False),
    ("a(b)c/def", "a(b)c/def", True),
    ("a(b)c/def", "a(b)c/xyz", False),
    ("a.|)$(}+{bc", "a.|)$(}+{bc", True),
    (
        "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl",
        "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl",
        True,
    ),
    ("dist/*.whl", "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", True),
    ("a\\*b", "a*b", True),
]

# multiPatternTests, and the single tests above them (TestPatternMatchesFolderExclusions...)
MULTI = [
    (["**", "!util/docker/web"], "util/docker/web/foo", False),
    (["**", "!util/docker/web", "util/docker/web/foo"], "util/docker/web/foo", True),
    (
        ["**", "!dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl"],
        "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl",
        False,
    ),
    (["**", "!dist/*.whl"], "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", False),
    (["*"], "fileutils.go", True),
    (["*.go"], "fileutils.go", True),
    (["!fileutils.go", "*.go"], "fileutils.go", True),
    (["docs", "!docs/README.md"], "docs/README.md", False),
    (["docs/", "!docs/README.md"], "docs/README.md", False),
    (["docs/*", "!docs/README.md"], "docs/README.md", False),
    (["*.go", "!fileutils.go"], "fileutils.go", False),
    (["*.go"], ".", False),
    ([], "/any/path/there", False),
]

# matchTests (Go's filepath.Match cases): (pattern, path, match, bad pattern)
GO_MATCH = [
    ("abc", "abc", True, False),
    ("*", "abc", True, False),
    ("*c", "abc", True, False),
    ("a*", "a", True, False),
    ("a*", "abc", True, False),
    ("a*", "ab/c", True, False),
    ("a*/b", "abc/b", True, False),
    ("a*/b", "a/c/b", False, False),
    ("a*b*c*d*e*/f", "axbxcxdxe/f", True, False),
    ("a*b*c*d*e*/f", "axbxcxdxexxx/f", True, False),
    ("a*b*c*d*e*/f", "axbxcxdxe/xxx/f", False, False),
    ("a*b*c*d*e*/f", "axbxcxdxexxx/fff", False, False),
    ("a*b?c*x", "abxbbxdbxebxczzx", True, False),
    ("a*b?c*x", "abxbbxdbxebxczzy", False, False),
    ("ab[c]", "abc", True, False),
    ("ab[b-d]", "abc", True, False),
    ("ab[e-g]", "abc", False, False),
    ("ab[^c]", "abc", False, False),
    ("ab[^b-d]", "abc", False, False),
    ("ab[^e-g]", "abc", True, False),
    ("a\\*b", "a*b", True, False),
    ("a\\*b", "ab", False, False),
    ("a?b", "a☺b", True, False),
    ("a[^a]b", "a☺b", True, False),
    ("a???b", "a☺b", False, False),
    ("a[^a][^a][^a]b", "a☺b", False, False),
    ("[a-ζ]*", "α", True, False),
    ("*[a-ζ]", "A", False, False),
    ("a?b", "a/b", False, False),
    ("a*b", "a/b", False, False),
    ("[\\]a]", "]", True, False),
    ("[\\-]", "-", True, False),
    ("[x\\-]", "x", True, False),
    ("[x\\-]", "-", True, False),
    ("[x\\-]", "z", False, False),
    ("[\\-x]", "x", True, False),
    ("[\\-x]", "-", True, False),
    ("[\\-x]", "a", False, False),
    ("[]a]", "]", False, True),
    ("[-]", "-", False, True),
    ("[x-]", "x", False, True),
    ("[x-]", "-", False, True),
    ("[x-]", "z", False, True),
    ("[-x]", "x", False, True),
    ("[-x]", "-", False, True),
    ("[-x]", "a", False, True),
    ("\\", "a", False, True),
    ("[a-b-c]", "a", False, True),
    ("[", "a", False, True),
    ("[^", "a", False, True),
    ("[^bc", "a", False, True),
    ("a[", "a", False, True),
    ("a[", "ab", False, True),
    ("*x", "xxx", True, False),
]

# compileTests: (pattern, kind, regexp)
COMPILE = [
    ("*", "regexp", "^[^/]*$"),
    ("file*", "regexp", "^file[^/]*$"),
    ("*file", "regexp", "^[^/]*file$"),
    ("a*/b", "regexp", "^a[^/]*/b$"),
    ("**", "suffix", ""),
    ("**/**", "regexp", "^(.*/)?.*$"),
    ("dir/**", "prefix", ""),
    ("**/dir", "suffix", ""),
    ("**/dir2/*", "regexp", "^(.*/)?dir2/[^/]*$"),
    ("**/dir2/**", "regexp", "^(.*/)?dir2/.*$"),
    ("**file", "suffix", ""),
    ("**/file*txt", "regexp", "^(.*/)?file[^/]*txt$"),
    ("**/**/*.txt", "regexp", "^(.*/)?(.*/)?[^/]*\\.txt$"),
    ("a[b-d]e", "regexp", "^a[b-d]e$"),
    (".*", "regexp", "^\\.[^/]*$"),
    ("abc.def", "exact", ""),
    ("abc?def", "regexp", "^abc[^/]def$"),
    ("**/foo/bar", "suffix", ""),
    ("a(b)c/def", "exact", ""),
    ("a.|)$(}+{bc", "exact", ""),
    ("dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", "exact", ""),
]


def _walked(matcher: PatternMatcher, path: str) -> bool:
    """As a walk decides it: each parent folder first, its results passed down."""
    info: list[bool] | None = None
    parent = clean(path[: path.rfind("/")]) if "/" in path else "."  # Go's filepath.Dir
    folders = parent.split("/") if parent != "." else []
    for depth in range(len(folders)):
        _, info = matcher.matches("/".join(folders[: depth + 1]), info)
    return matcher.matches(path, info)[0]


@pytest.mark.parametrize(("pattern", "path", "excluded"), MATCHES)
def test_moby_matches(pattern: str, path: str, excluded: bool) -> None:
    matcher = PatternMatcher([pattern])
    assert matcher.matches(path)[0] is excluded  # MatchesOrParentMatches / NoContext
    assert _walked(matcher, path) is excluded  # MatchesUsingParentResults


@pytest.mark.parametrize(("patterns", "path", "excluded"), MULTI)
def test_moby_multi_pattern(patterns: list[str], path: str, excluded: bool) -> None:
    matcher = PatternMatcher(patterns)
    assert matcher.excluded(path) is excluded
    if path not in (".", "/any/path/there"):
        assert _walked(matcher, path) is excluded


@pytest.mark.parametrize(("pattern", "path", "match", "bad"), GO_MATCH)
def test_go_filepath_match_cases(pattern: str, path: str, match: bool, bad: bool) -> None:
    if bad:
        with pytest.raises(BadPattern):
            PatternMatcher([pattern])
    else:
        assert PatternMatcher([pattern]).excluded(path) is match


@pytest.mark.parametrize(("pattern", "kind", "regexp"), COMPILE)
def test_moby_compile(pattern: str, kind: str, regexp: str) -> None:
    compiled = Pattern(pattern)
    assert compiled.kind == kind
    if kind == "regexp":
        assert compiled.regexp is not None and compiled.regexp.pattern == regexp


@pytest.mark.parametrize("patterns", [["!"], ["[Local-Only]/"]])
def test_bad_patterns_are_refused(patterns: list[str]) -> None:
    with pytest.raises(BadPattern):
        PatternMatcher(patterns)


def test_clean_patterns() -> None:
    assert len(PatternMatcher(["docs", "config", ""]).patterns) == 2
    for patterns in (["docs", "  !docs/README.md"], ["docs", "!docs/README.md  "]):
        assert [p.exclusion for p in PatternMatcher(patterns).patterns] == [False, True]


def test_read_ignore_file() -> None:
    content = (
        "test1\n/test2\n/a/file/here\n\nlastfile\n# this is a comment\n! /inverted/abs/path\n!\n! "
    )
    assert read_ignore_file(content) == [
        "test1",
        "test2",
        "a/file/here",
        "lastfile",
        "!inverted/abs/path",
        "!",
        "!",
    ]
    assert read_ignore_file("\ufeffbom\n  # not a comment\n") == ["bom", "# not a comment"]
