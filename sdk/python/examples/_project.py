"""What the examples put in a sandbox in place of what needs a network
(sandboxes have none yet; docs/sdk.md, "The seeds' examples"): a small
project at /app, built and tested with sh, for OpenComputer's ``npm
install && npm run build`` and ``npm run test:…``; a local repository for
its ``git clone https://github.com/user/repo``."""

# The project OpenComputer's page has at /app (its sandbox has it; ours
# starts empty), built with sh instead of npm.
PROJECT = (
    "mkdir -p /app && cd /app && "
    "printf '%s\\n' 'mkdir -p dist && echo built > dist/app.txt' > build.sh && "
    """printf '%s\\n' 'test "$(cat dist/app.txt)" = built && echo "$1 tests pass"' > test.sh"""
)
BUILD = "sh build.sh"  # was: npm install && npm run build
TEST_UNIT = "sh test.sh unit"  # was: npm run test:unit
TEST_E2E = "sh test.sh e2e"  # was: npm run test:e2e

# The repository the parallel exploration clones, made in the sandbox.
REPOSITORY = (
    "git init -q -b main /srv/repo && "
    "git -C /srv/repo -c user.name=example -c user.email=example@localhost commit -q --allow-empty -m init"
)
CLONE = "git clone /srv/repo /app"  # was: git clone https://github.com/user/repo /app
