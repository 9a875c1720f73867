# gradcomp on Debian bookworm: the same install script as the README and CI, then the build
# and the full test suite.
#   docker build -t gradcomp .
#   docker run --rm gradcomp            # runs the tests again
#   docker run --rm gradcomp ./gcrun -np 4 --compression maxmin --bits 4 /usr/bin/python3 examples/torch_digits.py
FROM debian:bookworm
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /opt/gradcomp
COPY scripts/install_deps.sh scripts/install_deps.sh
RUN bash scripts/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN bash scripts/test.sh
CMD ["bash", "scripts/test.sh"]
