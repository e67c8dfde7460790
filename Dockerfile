# syntax=docker/dockerfile:1
#
# The gateway image: Caddy with the caddy-llmgw modules, on Caddy's builder
# pattern (the official caddy image's "Adding custom Caddy modules"). From
# the repository root:
#
#   docker build -t registry.example.com/caddy-llmgw:v0.1.0 .
#
# The Caddy version is xcaddy.sh's CADDY_VERSION; change them together
# (deploy/manifesttest checks that they agree). The builder's Go must satisfy
# go.mod's go line: the golang images set GOTOOLCHAIN=local, so an older Go
# fails the build instead of downloading a newer one.

FROM caddy:2.11.9-builder AS builder

WORKDIR /src
COPY . .
# The module is not on the Go module proxy: name an explicit version and
# replace it with the copied checkout, as `./xcaddy.sh build` does. The cache
# mounts keep downloaded modules and compiled packages between builds.
RUN --mount=type=cache,target=/go/pkg/mod \
	--mount=type=cache,target=/root/.cache/go-build \
	xcaddy build v2.11.9 \
		--output /usr/bin/caddy \
		--with github.com/llmgw/caddy-llmgw@v0.0.0=/src
# Fail the build, not the first deploy, if the modules are missing.
RUN caddy list-modules | grep -qx 'http.handlers.llm_admission'

FROM caddy:2.11.9

COPY --from=builder /usr/bin/caddy /usr/bin/caddy
